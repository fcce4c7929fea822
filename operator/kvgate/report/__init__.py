"""Render a KVCacheRollout for people: a terminal summary and a self-contained HTML page.

Pure: takes the rollout object as a dict (as `kubectl get kvr NAME -o json` prints it) and
returns text. `assemble` builds its one `ReportView`, once, from the typed spec and status (`view`
reads each status block into the frozen records of `records`; what is missing is "-", never
guessed); `rows` turns them into the tables both renderers share, `fmt` writes numbers, and
`text`, `page` (HTML) and `svg` (the charts) render the view. A new chart is a function in `svg`
(or a module of its own) over the view.
"""

from __future__ import annotations

import datetime as dt

from kvgate.report import page, svg, text, view
from kvgate.report.assemble import build, view_of
from kvgate.report.records import ReportView


def render_text(rollout: object, now: dt.datetime | None = None) -> str:
    """The terminal report of any rollout JSON (`now`, default the clock: how long it runs)."""
    return text.render(view_of(rollout, now))


def render_html(rollout: object, now: dt.datetime | None = None) -> str:
    """The self-contained HTML page of any rollout JSON."""
    return page.render(view_of(rollout, now))


__all__ = [
    "ReportView",
    "build",
    "page",
    "render_html",
    "render_text",
    "svg",
    "text",
    "view",
    "view_of",
]
