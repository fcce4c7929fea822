"""The tables and sentences that the text and the HTML report share, built from the view model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from kvgate.records.loadresult import ARMS, StagePoint, sim_time_note
from kvgate.records.timestamps import duration
from kvgate.report.fields import as_fraction
from kvgate.report.fmt import (
    DASH,
    fmt_int,
    fmt_mhz,
    fmt_num,
    humanize,
    pct,
    pp,
    to_pp,
    wilson,
)
from kvgate.report.records import (
    Accuracy,
    ArmCapacity,
    DivergenceBucket,
    Load,
    LongContextBucket,
    Progress,
    Speed,
)
from kvgate.report.view import SEE_HEADLINE

ACCURACY_HEADER: Final = ("arm", "correct", "n", "accuracy", "95% Wilson")
CAPACITY_HEADER: Final = ("arm", "KV dtype", "backend", "KV tokens", "max concurrency")
LC_HEADER: Final = ("context", "control", "candidate", "recovery", "at least", "verdict")
DIV_HEADER: Final = (
    "positions", "A/A mean KL", "candidate mean KL", "A/A top-1", "candidate top-1", "flag"
)  # fmt: skip
SPEED_HEADER: Final = ("metric", *ARMS)
LOAD_HEADER: Final = (
    "concurrent",
    *(f"{arm} tok/s" for arm in ARMS),
    *(f"{arm} TPOT p50 ms" for arm in ARMS),
    *(f"{arm} TTFT p99 ms" for arm in ARMS),
)
GOODPUT_HEADER: Final = tuple(f"{arm} goodput %" for arm in ARMS)
ENGINE_HEADER: Final = ("preemptions ctl/cand", "waiting max ctl/cand")


def _any_stage(load: Load | None, counted: Callable[[StagePoint], bool]) -> bool:
    return load is not None and any(counted(s) for arm in load.arms.values() for s in arm.values())


def _has_goodput(load: Load | None) -> bool:
    """Whether any stage counted goodput (the spec gave SLOs): only then is it a column."""
    return _any_stage(load, lambda s: s.goodput_percent is not None)


def _has_engine_side(load: Load | None) -> bool:
    """Whether any stage carries the engine's side (preemptions, queue): only then a column."""
    return _any_stage(load, lambda s: s.preemptions is not None or s.max_waiting is not None)


def load_header(load: Load | None) -> tuple[str, ...]:
    goodput = GOODPUT_HEADER if _has_goodput(load) else ()
    engine = ENGINE_HEADER if _has_engine_side(load) else ()
    return (*LOAD_HEADER, *goodput, *engine)


def _pair(
    stages: Mapping[str, StagePoint | None], value: Callable[[StagePoint], float | None]
) -> str:
    """`control / candidate` of an engine-side figure, shown for an error stage too (what the
    engine did under it is evidence); `-` where unknown."""
    shown = []
    for arm in ARMS:
        stage = stages.get(arm)
        number = value(stage) if stage is not None else None
        shown.append(DASH if number is None else fmt_num(number))
    return " / ".join(shown)


def accuracy_rows(acc: Accuracy) -> list[list[str]]:
    return [
        [arm, fmt_int(a.correct), fmt_int(a.total), pct(a.accuracy), wilson(a.wilson95)]
        for arm, a in acc.arms.items()
    ]


def accuracy_heading(acc: Accuracy) -> str:
    parts = [acc.task or "accuracy", "paired"]
    if acc.questions_used is not None:
        parts.append(f"{acc.questions_used:,} questions")
    if acc.margin is not None:
        parts.append(f"margin {abs(to_pp(acc.margin)):.1f} pp")
    if acc.confidence is not None:
        parts.append(f"{100 * as_fraction(acc.confidence):.0f}% confidence")
    return f"Accuracy ({', '.join(parts)})"


def failed_accuracy(acc: Accuracy) -> str | None:
    """A failed gate, led by what was shown: `candidate worse: 82.0% vs control 88.7% (-6.7 pp);
    shown worse by at least 0.3 pp (97.5% one-sided, 3 looks)`."""
    if acc.verdict != "fail":
        return None
    control, candidate = acc.arms.get("control"), acc.arms.get("candidate")
    line = "candidate worse"
    if (
        control is not None
        and candidate is not None
        and None not in (control.accuracy, candidate.accuracy)
    ):
        line += f": {pct(candidate.accuracy)} vs control {pct(control.accuracy)}"
        if acc.difference is not None:
            line += f" ({pp(acc.difference)})"
    if acc.shown_worse_by is not None:
        facts = []
        if acc.fail_confidence is not None:
            facts.append(f"{100 * as_fraction(acc.fail_confidence):g}% one-sided")
        if acc.looks is not None:
            facts.append(f"{acc.looks} look{'s' if acc.looks != 1 else ''}")
        line += f"; shown worse by at least {abs(to_pp(acc.shown_worse_by)):.1f} pp"
        line += f" ({', '.join(facts)})" if facts else ""
    return line


def accuracy_notes(acc: Accuracy) -> list[str]:
    notes = []
    failed = failed_accuracy(acc)
    if failed is not None and not acc.in_headline:
        notes.append(failed)
    if acc.difference is not None:
        line = f"candidate - control: {pp(acc.difference)}"
        if acc.difference_ci is not None:
            low, high = acc.difference_ci
            # fixed-n and two-sided: not the bound the verdict rests on (first-hour-2 N12)
            looks = f", ignores the {acc.looks} looks" if acc.looks and acc.looks > 1 else ""
            line += (
                f", 95% CI [{to_pp(low):+.1f}, {to_pp(high):+.1f}] pp (fixed-n, two-sided{looks})"
            )
        if acc.mcnemar_p is not None:
            line += f", McNemar p={acc.mcnemar_p:.3g}"
        notes.append(line)
    if acc.discordant is not None:
        notes.append(
            f"answers that differ: control-only right {acc.discordant[0]}, "
            f"candidate-only right {acc.discordant[1]}"
        )
    if acc.verdict is not None:
        verdict = f"verdict: {acc.verdict}"
        if acc.ruled_out is not None and failed is None:
            verdict += (
                f" (the sequential test rules out a loss larger than "
                f"{abs(to_pp(acc.ruled_out)):.1f} pp)"
            )
        if acc.stopped_early:
            verdict += ", stopped early"
        if acc.in_headline:
            verdict += f" ({SEE_HEADLINE})"
        notes.append(verdict)
    if acc.questions_needed is not None and acc.verdict == "inconclusive":
        notes.append(f"about {acc.questions_needed:,} questions would settle it")
    if acc.error:
        notes.append(f"error: {acc.error}")
    return notes


def progress_lines(progress: Progress | None) -> list[str]:
    """`eval look 2/5: 200 of 500 questions, candidate - control -0.5 pp so far` and
    `running 12 min 5 s (in this phase 8 min 0 s)`; nothing for a finished rollout."""
    if progress is None:
        return []
    lines = []
    if progress.look is not None and progress.questions is not None:
        of = f" of {progress.questions_planned:,}" if progress.questions_planned else ""
        line = (
            f"eval look {progress.look}/{progress.looks_planned or '?'}: "
            f"{progress.questions:,}{of} questions answered"
        )
        if progress.difference is not None:
            line += f", candidate - control {pp(progress.difference)} so far"
        lines.append(line)
    if progress.running_s is not None:
        line = f"running {duration(progress.running_s)}"
        if progress.phase_s is not None:
            line += f" (in this phase {duration(progress.phase_s)})"
        lines.append(line)
    return lines


def long_context_rows(buckets: list[LongContextBucket]) -> list[list[str]]:
    return [
        [
            f"{b.context_length:,} tokens" if b.context_length else DASH,
            pct(b.control),
            pct(b.candidate),
            fmt_num(b.recovery),
            pp(b.lower),
            f"{b.verdict} ({b.reason})",
        ]
        for b in buckets
    ]


def divergence_rows(buckets: list[DivergenceBucket]) -> list[list[str]]:
    return [
        [
            b.bucket,
            f"{b.floor_kl or 0:.3g}",
            f"{b.candidate_kl or 0:.3g}",
            pct(b.floor_top1),
            pct(b.candidate_top1),
            "FLAG" if b.flagged else "",
        ]
        for b in buckets
    ]


def capacity_rows(arms: list[ArmCapacity]) -> list[list[str]]:
    return [
        [
            a.arm,
            a.kv_dtype if a.kv_dtype is not None else DASH,
            a.backend if a.backend is not None else DASH,
            fmt_int(a.kv_tokens),
            f"{a.max_concurrency:.1f}x" if a.max_concurrency is not None else DASH,
        ]
        for a in arms
    ]


def speed_rows(speed: Speed | None) -> list[list[str]]:
    """One row per measured figure, then the arms' GPU clocks when the status has them."""
    if speed is None:
        return []
    rows = [[humanize(m.key), *(fmt_num(m.values.get(arm)) for arm in ARMS)] for m in speed.metrics]
    clocks = speed.clocks
    if clocks is not None:
        sm, mem = [], []
        for c in (clocks.control, clocks.candidate):  # ARMS' order
            sm.append(fmt_mhz(c.sm_mhz, c.sm_range_mhz) if c else DASH)
            mem.append(fmt_mhz(c.mem_mhz, c.mem_range_mhz) if c else DASH)
        rows += [["SM clock (MHz)", *sm], ["memory clock (MHz)", *mem]]
    return rows


def clock_note(speed: Speed | None) -> str | None:
    """Why the clocks are unknown (or anything else the operator says about them)."""
    if speed is None or speed.clocks is None or speed.clocks.note is None:
        return None
    return f"GPU clocks: {speed.clocks.note}"


def load_clock_note(load: Load) -> str | None:
    """The arms' SM clocks over the load's run, or why they are unknown (None: not read)."""
    clocks = load.clocks
    if clocks is None:
        return None
    sm = {"control": clocks.control, "candidate": clocks.candidate}
    if clocks.note or any(c is None or c.sm_mhz is None for c in sm.values()):
        return f"GPU clocks during the load: {clocks.note or 'unknown'}"
    shown = ", ".join(
        f"{arm} {fmt_mhz(c.sm_mhz, c.sm_range_mhz)} MHz" for arm, c in sm.items() if c is not None
    )
    return f"GPU SM clocks during the load: {shown}"


def _stage_cell(stage: StagePoint | None, value: float | None) -> str:
    if stage is None:
        return DASH
    if not stage.measured:
        return "error"
    return fmt_num(value)


def load_rows(load: Load | None) -> list[list[str]]:
    """One row per concurrency level; a stage that is not a measurement reads `error`."""
    if load is None:
        return []
    goodput, engine = _has_goodput(load), _has_engine_side(load)
    out = []
    for level in load.levels:
        stages = {arm: load.arms.get(arm, {}).get(level) for arm in ARMS}
        mark = " (production)" if level == load.production_concurrency else ""
        row = [
            f"{level}{mark}",
            *(_stage_cell(s, s.output_tokens_per_s if s else None) for s in stages.values()),
            *(_stage_cell(s, s.tpot_p50_ms if s else None) for s in stages.values()),
            *(_stage_cell(s, s.ttft_p99_ms if s else None) for s in stages.values()),
        ]
        if goodput:
            row += [_stage_cell(s, s.goodput_percent if s else None) for s in stages.values()]
        if engine:
            row += [_pair(stages, lambda s: s.preemptions), _pair(stages, lambda s: s.max_waiting)]
        out.append(row)
    return out


BAR_WIDTH: Final = 32
BAR_MARKS: Final = {"control": "#", "candidate": "="}


def load_charts(load: Load | None) -> list[str]:
    """The load table as two text charts: output tok/s and TPOT p50 against concurrency, one bar
    per arm and level, each chart scaled to its largest value. A stage that is not a
    measurement reads `error`, an arm without the stage `-`; production's level is starred."""
    if load is None or not load.levels:
        return []
    charts: tuple[tuple[str, Callable[[StagePoint], float | None]], ...] = (
        ("output tok/s", lambda s: s.output_tokens_per_s),
        ("TPOT p50 ms", lambda s: s.tpot_p50_ms),
    )
    legend = ", ".join(f"{mark} {arm}" for arm, mark in BAR_MARKS.items())
    width = max(len(str(level)) for level in load.levels) + 1
    lines: list[str] = []
    for title, value_of in charts:
        values = [
            value_of(stage)
            for arm in ARMS
            for stage in load.arms.get(arm, {}).values()
            if stage.measured and value_of(stage) is not None
        ]
        top = max((v for v in values if v is not None and v > 0), default=None)
        if top is None:
            continue
        lines += [""] if lines else []
        lines.append(f"{title} against concurrency ({legend}; * production's load)")
        for level in load.levels:
            star = "*" if level == load.production_concurrency else " "
            for number, arm in enumerate(ARMS):
                stage = load.arms.get(arm, {}).get(level)
                label = f"{level}{star}".rjust(width) if number == 0 else " " * width
                value = value_of(stage) if stage is not None and stage.measured else None
                if stage is None:
                    bar = DASH
                elif value is None:
                    bar = "error"
                else:
                    bar = f"{BAR_MARKS[arm] * max(1, round(BAR_WIDTH * value / top))} {fmt_num(value)}"
                lines.append(f"{label} {arm:<9} {bar}")
    return lines


def load_notes(load: Load | None) -> list[str]:
    """The gain at production's load and at the best stages, the workload's request lengths
    (and where they were read), and why error stages are errors."""
    if load is None:
        return []
    notes = [sim_time_note(load.time_scale)] if load.time_scale is not None else []
    if load.gain is not None:
        notes.append(
            f"throughput gain at production load {load.production_concurrency}: {load.gain:.2f}x"
        )
    if load.best_gain is not None:
        notes.append(f"best stage against best stage: {load.best_gain:.2f}x")
    if load.lengths:
        notes.append(load.lengths)
    clocks = load_clock_note(load)
    if clocks:
        notes.append(clocks)
    if len(load.preemptions) == len(ARMS):
        counts = ", ".join(f"{arm} {load.preemptions[arm]:,.0f}" for arm in ARMS)
        notes.append(f"preemptions during the load: {counts}")
    for arm in ARMS:
        for level, stage in sorted(load.arms.get(arm, {}).items()):
            if not stage.measured and stage.reasons:
                notes.append(f"{arm} at {level}: {stage.reasons[0]}")
    return notes


def load_title(load: Load | None, what: str) -> str:
    """The load section's heading; on a sped-up simulator it says so where the figures start."""
    if load is None or load.time_scale is None:
        return what
    return f"{what}: simulated, {1 / load.time_scale:,.0f}x real time, wall-clock figures"
