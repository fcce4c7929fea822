"""The HTML report: one self-contained page (inline CSS and SVG, no scripts, no external links)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from kvgate.report import rows
from kvgate.report.fmt import e, mark, shell_command
from kvgate.report.records import ReportView
from kvgate.report.svg import (
    render_difference_svg,
    render_load_svg,
    render_long_context_svg,
    render_svg,
)
from kvgate.report.view import BAD_PHASES, GOOD_PHASES, WAIT_PHASES

_CSS: Final = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:60rem;padding:0 1rem;color:#1d2330;background:#fbfcfe}
h1{font-size:1.5rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.8rem 0 .5rem}
.sub{color:#5b6475;margin:0 0 1rem}.badge{display:inline-block;padding:.15rem .6rem;
border-radius:1rem;font-weight:600;font-size:.9rem;vertical-align:middle;margin-left:.5rem}
.good{background:#dff5e3;color:#17612a}.bad{background:#fde2e1;color:#8a1c17}
.wait{background:#fff1cc;color:#7a5500}.info{background:#e4ecfb;color:#1f3f7a}
table{border-collapse:collapse;width:100%;max-width:100%;margin:.3rem 0}
th,td{padding:.35rem .6rem;border-bottom:1px solid #e3e7ee;text-align:left;vertical-align:top}
td.long{overflow-wrap:anywhere}td.n,th.n{text-align:right;
font-variant-numeric:tabular-nums}th{font-weight:600;color:#5b6475;font-size:.85rem}
code{background:#eef1f6;padding:.15rem .35rem;border-radius:.25rem}
pre{background:#eef1f6;padding:.7rem .9rem;border-radius:.4rem;white-space:pre-wrap;
overflow-wrap:anywhere}
.msg{background:#fff;border-left:4px solid #9aa5b8;padding:.6rem .9rem;overflow-wrap:anywhere}
.remedy{border-left-color:#d9822b}.where{border-left-color:#1f3f7a}
details{overflow-wrap:anywhere}details summary{cursor:pointer;color:#5b6475}
details pre{font-size:.85rem;margin:.3rem 0}
svg{background:#fff;border:1px solid #e3e7ee;border-radius:.4rem;max-width:100%}
ul.notes{margin:.3rem 0;padding-left:1.2rem}td.ok{color:#17612a;font-weight:600}
td.no{color:#8a1c17;font-weight:600}td.maybe{color:#7a5500;font-weight:600}
td.skip{color:#5b6475}.prod{border-left-color:#5b6475}
"""


def _phase_class(phase: str) -> str:
    if phase in GOOD_PHASES:
        return "good"
    if phase in BAD_PHASES:
        return "bad"
    if phase in WAIT_PHASES:
        return "wait"
    return "info"


def _result_class(status: str) -> str:
    """Colour of a gate result: a condition status or an Outcome value."""
    if status in ("True", "Successful", "NotNeeded"):
        return "ok"
    if status in ("False", "Failed", "Error"):
        return "no"
    if status == "Skipped":  # nothing to look at: grey, not the amber of a warning
        return "skip"
    return "maybe"


# A log line or message longer than this shows its start; the whole text folds into <details>.
FOLD_AT: Final = 160


def folded(text: str) -> str:
    """`text` as HTML, folded into a <details> (its start as the summary) when it is long."""
    if len(text) <= FOLD_AT:
        return e(text)
    return (
        f"<details><summary>{e(text[:FOLD_AT].rstrip())}…</summary><pre>{e(text)}</pre></details>"
    )


def _html_table(
    header: Sequence[str],
    body: Iterable[Sequence[str]],
    numeric_from: int,
    widths: Sequence[int] = (),
    fold: Sequence[int] = (),
    long: Sequence[int] = (),
) -> str:
    """A table sized by its content (`widths` in percent per column as a preference). Words
    stay whole, so short columns are as wide as their longest word ("Successful" never breaks);
    only the `long` and `fold` columns (messages, raw log lines) may break a word anywhere, and
    the long cells of the `fold` columns fold into <details>."""

    def cell(tag: str, i: int, text: str) -> str:
        classes = [c for c, on in (("n", i >= numeric_from),
                                   ("long", tag == "td" and (i in long or i in fold))) if on]  # fmt: skip
        cls = f' class="{" ".join(classes)}"' if classes else ""
        return f"<{tag}{cls}>{folded(text) if tag == 'td' and i in fold else e(text)}</{tag}>"

    cols = "".join(f'<col style="width:{w}%">' for w in widths)
    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    trs = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in body
    )
    colgroup = f"<colgroup>{cols}</colgroup>" if cols else ""
    return f"<table>{colgroup}<thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>"


def _notes(notes: Sequence[str]) -> str:
    return "<ul class='notes'>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>"


def render(view: ReportView) -> str:
    head = view.header
    namespace, name, phase = head.namespace, head.name, head.phase
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>kvgate: {e(namespace)}/{e(name)} {e(phase)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{e(name)}<span class='badge {_phase_class(phase)}'>{e(phase)}</span></h1>",
        f"<p class='sub'>KVCacheRollout in namespace <code>{e(namespace)}</code>, "
        f"target <code>{e(head.target)}</code>"
        + (f", mode <code>{e(head.mode)}</code>" if head.mode else "")
        + "</p>",
    ]
    headline = view.headline
    if headline is not None:
        out.append(f"<p class='msg'>{e(headline.cause)}</p>")
        if headline.remedy:
            out.append(f"<p class='msg remedy'><b>Remedy:</b> {e(headline.remedy)}</p>")
        if headline.where:
            out.append(f"<p class='msg where'><b>Where:</b> {e(headline.where)}</p>")
        if headline.raw:
            out.append(
                "<details><summary>the engine's line</summary>"
                f"<pre>{e(headline.raw)}</pre></details>"
            )
    if view.production:
        out.append(f"<p class='msg prod'><b>Production:</b> {e(view.production)}</p>")
    if view.approval:
        commands, expiry = view.approval[:2], view.approval[2:]
        out.append(
            "<p class='msg where'><b>Approve</b> with either command"
            + "".join(f" ({e(x)})" for x in expiry)
            + ":</p>"
            f"<pre>{e(chr(10).join(commands))}</pre>"
        )
    facts = [f"verdict: {view.verdict}"] if view.verdict else []
    facts += [f"took {view.duration}"] if view.duration else []
    facts += rows.progress_lines(view.progress)
    if facts:
        out.append("<p class='sub'>" + " · ".join(e(f) for f in facts) + "</p>")
    out.append("<h2>Control and candidate</h2>")
    out.append(render_svg(view))
    out.append(f"<h2>{view.args_heading}</h2>")
    out.append(f"<pre>{e(shell_command(view.args))}</pre>" if view.args else "<p>(none yet)</p>")

    if view.findings:
        out.append("<h2>Findings</h2>")
        trs = "".join(
            f"<tr><td>{e(f.gate)}</td><td class='{_result_class(f.status)}'>{e(mark(f.status))}"
            f"</td><td>{e(f.reason)}</td><td class='long'>{folded(f.message)}</td></tr>"
            for f in view.findings
        )
        cols = "".join(f'<col style="width:{w}%">' for w in (15, 11, 20, 54))
        out.append(
            f"<table><colgroup>{cols}</colgroup><thead><tr><th>gate</th><th>result</th>"
            f"<th>reason</th><th>message</th></tr></thead><tbody>{trs}</tbody></table>"
        )
    if view.preflight:
        out.append("<h2>Production</h2>" + _notes(view.preflight))
    if view.log_lines:
        out.append("<h2>Startup logs</h2>")
        out.append(
            _html_table(
                ["arm", "severity", "finding", "line", "remedy"],
                [[ll.arm, ll.severity, ll.code, ll.text, ll.hint] for ll in view.log_lines],
                numeric_from=99,
                widths=(11, 10, 17, 34, 28),
                fold=(3,),
                long=(4,),
            )
        )
    acc = view.accuracy
    if acc is not None:
        out.append(f"<h2>{e(rows.accuracy_heading(acc))}</h2>")
        out.append(render_difference_svg(view))
        if acc.arms:
            out.append(_html_table(rows.ACCURACY_HEADER, rows.accuracy_rows(acc), numeric_from=1))
        if notes := rows.accuracy_notes(acc):
            out.append(_notes(notes))
    lc_rows = rows.long_context_rows(view.long_context)
    if lc_rows:
        out.append("<h2>Long context (paired, per context length)</h2>")
        out.append(render_long_context_svg(view))
        out.append(_html_table(rows.LC_HEADER, lc_rows, numeric_from=1))
    div_rows = rows.divergence_rows(view.divergence)
    if div_rows:
        out.append("<h2>Token divergence (teacher-forced, per position bucket)</h2>")
        out.append(_html_table(rows.DIV_HEADER, div_rows, numeric_from=1))
    cap_rows = rows.capacity_rows(view.capacity)
    if cap_rows:
        out.append("<h2>Capacity</h2>")
        out.append(_html_table(rows.CAPACITY_HEADER, cap_rows, numeric_from=3))
    speed_rows = rows.speed_rows(view.speed)
    if speed_rows:
        out.append("<h2>Speed</h2>")
        out.append(_html_table(rows.SPEED_HEADER, speed_rows, 1))
    note = rows.clock_note(view.speed)
    if note:
        out.append(f"<p class='sub'>{e(note)}</p>")
    load = view.load
    load_rows = rows.load_rows(load)
    if load_rows:
        out.append(
            f"<h2>{e(rows.load_title(load, 'Load (inference-perf on both arms at once)'))}</h2>"
        )
        out.append(render_load_svg(view))
        out.append(_html_table(rows.load_header(load), load_rows, numeric_from=1))
        if notes := rows.load_notes(load):
            out.append(_notes(notes))
    out.append("</body></html>")
    return "\n".join(out) + "\n"
