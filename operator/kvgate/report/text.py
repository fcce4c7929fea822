"""The terminal report: verdict, findings, accuracy, capacity, speed, recommended args."""

from __future__ import annotations

import textwrap

from kvgate.report import rows
from kvgate.report.fmt import WRAP, mark, shell_command, table
from kvgate.report.records import ReportView


def _wrap(text: str, indent: str = "  ", then: str = "    ") -> list[str]:
    return textwrap.wrap(text, WRAP, initial_indent=indent, subsequent_indent=then)


def render(view: ReportView) -> str:
    head = view.header
    lines = [f"KVCacheRollout {head.namespace}/{head.name}: {head.phase}"]
    facts = [f"target {head.target}"]
    if head.mode:
        facts.append(f"mode {head.mode}")
    if head.kv_cache_dtype:
        facts.append(f"candidate --kv-cache-dtype {head.kv_cache_dtype}")
    lines.append("  " + ", ".join(facts))
    headline = view.headline
    labelled: list[tuple[str, str | None]] = []
    if headline is not None:
        lines += _wrap(headline.cause)
        labelled = [("remedy", headline.remedy), ("where", headline.where)]
        labelled.append(("engine log", headline.raw))
    for label, said in [*labelled, ("verdict", view.verdict), ("production", view.production)]:
        if said:
            lines += _wrap(f"{label}: {said}")
    if view.approval:
        lines.append("  approve with either command:")
        lines += [f"    {line}" for line in view.approval]
    if view.duration:
        lines.append(f"  took {view.duration}")
    lines += [f"  {line}" for line in rows.progress_lines(view.progress)]

    if view.remediation:
        lines += ["", "Remediation"]
        for line in view.remediation:
            lines += _wrap(line)

    if view.preflight:
        lines += ["", "Production", *[f"  {p}" for p in view.preflight]]

    if view.findings:
        lines += ["", "Findings"]
        lines += table(
            ["gate", "result", "reason", "message"],
            [[f.gate, mark(f.status), f.reason, f.message] for f in view.findings],
            numeric_from=99,
        )

    if view.log_lines:
        lines += ["", "Startup logs"]
        for ll in view.log_lines:
            lines += _wrap(f"{ll.arm} {ll.severity} {ll.code}: {ll.text}", then="      ")
            if ll.hint:
                lines += _wrap(f"remedy: {ll.hint}", indent="    ", then="      ")

    acc = view.accuracy
    if acc is not None:
        lines += ["", rows.accuracy_heading(acc)]
        if acc.arms:
            lines += table(rows.ACCURACY_HEADER, rows.accuracy_rows(acc))
        lines += [f"  {line}" for line in rows.accuracy_notes(acc)]
    lc_rows = rows.long_context_rows(view.long_context)
    if lc_rows:
        lines += ["", "Long context (paired, per context length)"]
        lines += table(rows.LC_HEADER, lc_rows)
    div_rows = rows.divergence_rows(view.divergence)
    if div_rows:
        lines += ["", "Token divergence (teacher-forced, per position bucket)"]
        lines += table(rows.DIV_HEADER, div_rows)

    cap_rows = rows.capacity_rows(view.capacity)
    if cap_rows:
        lines += ["", "Capacity"]
        lines += table(rows.CAPACITY_HEADER, cap_rows, numeric_from=3)
        if view.capacity_gain is not None:
            lines.append(f"  candidate holds {view.capacity_gain:.2f}x the control's KV tokens")

    speed_rows = rows.speed_rows(view.speed)
    if speed_rows:
        lines += ["", "Speed"]
        lines += table(rows.SPEED_HEADER, speed_rows)
    note = rows.clock_note(view.speed)
    if note:
        lines += _wrap(note)

    load = view.load
    load_rows = rows.load_rows(load)
    if load_rows:
        lines += [
            "",
            rows.load_title(
                load,
                "Load (inference-perf on both arms at once; tok/s and TPOT against concurrency)",
            ),
        ]
        lines += table(rows.load_header(load), load_rows)
        for line in rows.load_notes(load):
            lines += _wrap(line)
        charts = rows.load_charts(load)
        if charts:
            lines.append("")
            lines += [f"  {line}" for line in charts]

    lines += ["", view.args_heading]
    args = shell_command(view.args).splitlines() if view.args else ["(none yet)"]
    lines += [f"  {line}" for line in args]
    return "\n".join(lines) + "\n"
