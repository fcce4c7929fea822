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

from kvgate.report import page, svg, text
from kvgate.report.assemble import build, view_of
from kvgate.report.fmt import shell_command
from kvgate.report.records import Finding, ReportView
from kvgate.report.view import (
    args_heading,
    read_accuracy,
    read_capacity,
    read_capacity_gain,
    read_duration,
    read_findings,
    read_load,
    read_preflight,
    read_speed,
    read_verdict,
    split_remedy,
)


def render_text(rollout: object, now: dt.datetime | None = None) -> str:
    """The terminal report of any rollout JSON (`now`, default the clock: how long it runs)."""
    return text.render(view_of(rollout, now))


def render_html(rollout: object, now: dt.datetime | None = None) -> str:
    """The self-contained HTML page of any rollout JSON."""
    return page.render(view_of(rollout, now))


def _status_view(status: object) -> ReportView:
    return view_of({"status": status})


def render_svg(status: object) -> str:
    """The accuracy and KV tokens chart of a status alone."""
    return svg.render_svg(_status_view(status))


def render_difference_svg(status: object) -> str:
    return svg.render_difference_svg(_status_view(status))


def render_long_context_svg(status: object) -> str:
    return svg.render_long_context_svg(_status_view(status))


def render_load_svg(status: object) -> str:
    return svg.render_load_svg(_status_view(status))


def read_approval(rollout: object) -> list[str]:
    """The approval commands of a rollout waiting for one (its view's)."""
    return view_of(rollout).approval


__all__ = [
    "Finding",
    "ReportView",
    "args_heading",
    "build",
    "read_accuracy",
    "read_approval",
    "read_capacity",
    "read_capacity_gain",
    "read_duration",
    "read_findings",
    "read_load",
    "read_preflight",
    "read_speed",
    "read_verdict",
    "render_difference_svg",
    "render_html",
    "render_load_svg",
    "render_long_context_svg",
    "render_svg",
    "render_text",
    "shell_command",
    "split_remedy",
    "view_of",
]
