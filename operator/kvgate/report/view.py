"""Reads a typed status (`RolloutStatus`, or a dict read through it once) into the report's view
model, the frozen records of `records`. Every field is optional, because a report is asked for at
any phase; what is missing or unreadable is `None` (shown as "-"), never guessed, and no value of
any type raises.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Sequence
from typing import Final

from kvgate.judge import gates
from kvgate.reasons import Reason
from kvgate.records.evalsummary import ArmAccuracy, BoundsRecord, PairedRecord, TokenAgreement
from kvgate.records.loadresult import ARMS, StagePoint, time_scale
from kvgate.records.status import (
    MAX_MHZ,
    ClockRecord,
    ClocksRecord,
    FirstAttempt,
    RolloutStatus,
    ScanRecord,
)
from kvgate.records.timestamps import duration, parse_time
from kvgate.report.fields import (
    StatusLike,
    as_fraction,
    finite_number,
    integer,
    interval,
)
from kvgate.report.fmt import DASH, pct
from kvgate.report.records import (
    Accuracy,
    ArmCapacity,
    DivergenceBucket,
    Finding,
    Header,
    Headline,
    Load,
    LogLine,
    LongContextBucket,
    Progress,
    ReportView,
    Speed,
    SpeedMetric,
)
from kvgate.vocabulary import Phase

# kstatus conditions say how the object is doing, not what the gates found.
_KSTATUS: Final = frozenset({"Ready", "Reconciling", "Stalled"})
_GATE_ORDER: Final = {g: i for i, g in enumerate(gates.GATE_ORDER)}  # the order gates run in
GOOD_PHASES: Final = frozenset({Phase.PROMOTED.value, Phase.NOT_NEEDED.value})
BAD_PHASES: Final = frozenset({Phase.ROLLED_BACK.value, Phase.FAILED.value, Phase.DECLINED.value})
# Waiting for a person: an approval (manual mode), a merge (pullRequest mode).
WAIT_PHASES: Final = frozenset({Phase.AWAITING_APPROVAL.value, Phase.PULL_REQUEST_OPEN.value})


def typed_status(status: StatusLike) -> RolloutStatus:
    """The status as the typed record (a record is itself: a view reads it, never re-parses)."""
    return status if isinstance(status, RolloutStatus) else RolloutStatus.from_dict(status)


def read_view(
    status: RolloutStatus,
    header: Header,
    *,
    headline: Headline | None,
    production: str | None,
    approval: list[str],
    now: dt.datetime,
) -> ReportView:
    """The report's one view: every status block read once, beside what the spec and the
    rollout's name give (`assemble` reads those); `now` only says how long it has been running."""
    finished = is_finished(status)
    accuracy, findings = said_once(status, header, read_accuracy(status), read_findings(status))
    return ReportView(
        header=header,
        finished=finished,
        headline=headline,
        verdict=read_verdict(status),
        production=production,
        approval=approval,
        duration=read_duration(status),
        progress=None if finished else read_progress(status, header, now),
        remediation=read_remediation(status),
        preflight=read_preflight(status),
        findings=findings,
        log_lines=read_log_findings(status),
        accuracy=accuracy,
        long_context=read_long_context(status),
        divergence=read_divergence(status),
        capacity=read_capacity(status),
        kv_tokens={arm: read_kv_tokens(status, arm) for arm in ARMS},
        capacity_gain=read_capacity_gain(status),
        speed=read_speed(status),
        load=read_load(status),
        args=list(status.recommended_args),
        args_heading=args_heading(status),
    )


# ---------------------------------------------------------------- accuracy


def read_accuracy(status: StatusLike) -> Accuracy | None:
    """`status.accuracy` (the eval summary) as an `Accuracy`."""
    acc = typed_status(status).accuracy
    if acc is None:
        return None
    arms: dict[str, ArmAccuracy] = {}
    for arm, raw in (("control", acc.control), ("candidate", acc.candidate)):
        if raw is None:
            continue
        correct, n = integer(raw.correct), integer(raw.total)
        accuracy = as_fraction(finite_number(raw.accuracy))
        if accuracy is None and correct is not None and n:
            accuracy = correct / n
        wilson = interval(raw.wilson95)
        if wilson is not None and max(wilson) > 1.0:
            wilson = (wilson[0] / 100.0, wilson[1] / 100.0)
        arms[arm] = dataclasses.replace(
            raw, correct=correct, total=n, accuracy=accuracy, wilson95=wilson or ()
        )
    paired, bounds = acc.paired or PairedRecord(), acc.bounds or BoundsRecord()
    control_only, candidate_only = integer(paired.control_only), integer(paired.candidate_only)
    points = finite_number(acc.difference_pp)  # the CRD's printer column, in points
    return Accuracy(
        verdict=acc.verdict,
        task=acc.task,
        margin=finite_number(acc.margin),
        confidence=finite_number(acc.confidence),
        questions_used=integer(acc.questions_used),
        stopped_early=acc.stopped_early,
        arms=arms,
        difference=points / 100.0 if points is not None else finite_number(paired.difference),
        difference_ci=interval(paired.tango95),
        mcnemar_p=finite_number(paired.mcnemar_p),
        discordant=(
            (control_only, candidate_only)
            if control_only is not None and candidate_only is not None
            else None
        ),
        ruled_out=finite_number(acc.largest_loss_ruled_out),
        questions_needed=integer(acc.advice.questions_needed) if acc.advice is not None else None,
        error=acc.error,
        lower_bound=finite_number(paired.lower_bound),
        upper_bound=finite_number(paired.upper_bound),
        shown_worse_by=_shown_worse_by(acc.smallest_loss_shown, paired.upper_bound),
        fail_confidence=finite_number(bounds.upper_confidence),
        looks=integer(bounds.look),
    )


def _shown_worse_by(shown: float | None, upper: float | None) -> float | None:
    """The loss a fail showed: the summary's figure, else minus the upper bound (at least 0)."""
    value = finite_number(shown)
    if value is None and (bound := finite_number(upper)) is not None:
        value = -bound
    return max(0.0, value) if value is not None else None


def read_long_context(status: RolloutStatus) -> list[LongContextBucket]:
    """Per context-length bucket: both arms' scores, recovery, the lower bound, the verdict."""
    acc = status.accuracy
    block = acc.long_context if acc is not None else None
    return [
        LongContextBucket(
            context_length=b.context_length,
            control=finite_number(b.control.accuracy) if b.control is not None else None,
            candidate=finite_number(b.candidate.accuracy) if b.candidate is not None else None,
            recovery=finite_number(b.recovery),
            lower=finite_number(b.bounds.lower) if b.bounds is not None else None,
            verdict=DASH if b.verdict is None else b.verdict,
            reason=DASH if b.reason is None else b.reason,
        )
        for b in (block.buckets if block is not None else ())
    ]


def read_divergence(status: RolloutStatus) -> list[DivergenceBucket]:
    """Per position bucket: the A/A floor and the candidate, KL and top-1 agreement."""
    acc = status.accuracy
    block = acc.divergence if acc is not None else None
    out = []
    for b in block.buckets if block is not None else ():
        floor, cand = b.floor or TokenAgreement(), b.candidate or TokenAgreement()
        out.append(
            DivergenceBucket(
                bucket=DASH if b.bucket is None else b.bucket,
                floor_kl=finite_number(floor.mean_kl),
                candidate_kl=finite_number(cand.mean_kl),
                floor_top1=finite_number(floor.top1_agreement),
                candidate_top1=finite_number(cand.top1_agreement),
                flagged=bool(b.flagged),
            )
        )
    return out


# ---------------------------------------------------------------- findings and logs


_ACCURACY_ROWS: Final = frozenset({gates.ACCURACY, "AccuracyNonInferior"})  # gate, condition
# Where the headline already states a failed accuracy gate, the Findings row and the Accuracy
# section point at it rather than say it again (first-hour-2 #26).
SEE_HEADLINE: Final = "shown worse: the headline above"


def said_once(
    status: RolloutStatus, header: Header, acc: Accuracy | None, findings: list[Finding]
) -> tuple[Accuracy | None, list[Finding]]:
    """A failed accuracy gate the headline states (the rollout ended on it) is said there
    only: its Findings row and the Accuracy section refer to it (first-hour-2 #26)."""
    message = header.message or ""
    if acc is None or acc.verdict != "fail" or not message:
        return acc, findings
    rows_ = [f for f in findings if f.gate in _ACCURACY_ROWS]
    ended_on_it = status.reason == Reason.ACCURACY_REGRESSED
    if not (ended_on_it or any(f.message and f.message in message for f in rows_)):
        return acc, findings
    refer = f"{SEE_HEADLINE}; the figures under Accuracy"
    return dataclasses.replace(acc, in_headline=True), [
        dataclasses.replace(f, message=refer) if f in rows_ else f for f in findings
    ]


def read_findings(status: StatusLike) -> list[Finding]:
    """Gate results: `status.gates` (by gate name, in gate order), else conditions."""
    typed = typed_status(status)
    found = [Finding(gate, g.outcome.value, g.reason, g.message) for gate, g in typed.gates.items()]
    # The order the gates run in; unknown names keep their place after them.
    found.sort(key=lambda f: _GATE_ORDER.get(f.gate, len(_GATE_ORDER)))
    if found:
        return found
    return [
        Finding(c.type or DASH, c.status or DASH, c.reason or "", c.message or "")
        for c in typed.conditions
        if c.type not in _KSTATUS
    ]


def _scan(status: RolloutStatus, arm: str) -> ScanRecord:
    """The arm's startup-log scan (`status.arms.<arm>.scan`), or an empty one."""
    block = status.arms.get(arm)
    return block.scan if block is not None and block.scan is not None else ScanRecord()


def read_log_findings(status: RolloutStatus) -> list[LogLine]:
    """Warnings and errors from each arm's startup-log scan (info lines are left out)."""
    return [
        LogLine(arm, f.severity, f.code or "", (f.text or "").strip(), (f.hint or "").strip())
        for arm in ARMS
        for f in _scan(status, arm).findings
        if f.severity in ("warning", "error")
    ]


# ---------------------------------------------------------------- capacity and speed


def read_kv_tokens(status: RolloutStatus, arm: str) -> float | None:
    """The arm's KV cache size in tokens, as its engine reported it at startup."""
    capacity = _scan(status, arm).capacity
    return finite_number(capacity.kv_tokens) if capacity is not None else None


def read_capacity(status: StatusLike) -> list[ArmCapacity]:
    """Each arm with any KV figure: dtype, attention backend, KV tokens, max concurrency."""
    typed = typed_status(status)
    out: list[ArmCapacity] = []
    for arm in ARMS:
        scan = _scan(typed, arm)
        tokens = read_kv_tokens(typed, arm)
        conc = finite_number(scan.capacity.max_concurrency) if scan.capacity is not None else None
        dtype, backend = scan.kv_cache_dtype, scan.attention_backend
        if dtype is None and tokens is None and conc is None and backend is None:
            continue
        out.append(ArmCapacity(arm, dtype, backend, tokens, conc))
    return out


def read_capacity_gain(status: StatusLike) -> float | None:
    """Candidate KV tokens over control KV tokens (from the status, else computed)."""
    typed = typed_status(status)
    gain = finite_number(typed.capacity.ratio) if typed.capacity is not None else None
    if gain is not None:
        return gain
    control, candidate = read_kv_tokens(typed, "control"), read_kv_tokens(typed, "candidate")
    if control and candidate is not None:
        return candidate / control
    return None


def read_speed(status: StatusLike) -> Speed | None:
    """`status.speed`: the numeric figures per arm (whatever the operator measured), and clocks."""
    speed = typed_status(status).speed
    if speed is None:
        return None
    blocks = {"control": speed.control, "candidate": speed.candidate}
    keys: list[str] = []
    for block in blocks.values():
        keys.extend(k for k, v in block.items() if finite_number(v) is not None and k not in keys)
    metrics = [
        SpeedMetric(key, {arm: finite_number(block.get(key)) for arm, block in blocks.items()})
        for key in keys
    ]
    return Speed(metrics=metrics, clocks=_clocks(speed.clocks))


def read_load(status: StatusLike) -> Load | None:
    """`status.load`: every stage both arms ran, by concurrency (None: no load measured)."""
    load = typed_status(status).load
    summary = load.summary if load is not None else None
    if load is None or summary is None:
        return None
    arms: dict[str, dict[int, StagePoint]] = {}
    for arm in ARMS:
        record = summary.arm(arm)
        arms[arm] = {}
        for stage in record.stages if record is not None else ():  # the first at a level
            if stage.concurrency is not None:
                arms[arm].setdefault(stage.concurrency, stage)
    levels = sorted({c for stages in arms.values() for c in stages})
    if not levels:
        return None
    return Load(
        production_concurrency=summary.production_concurrency,
        gain=load.throughput_gain,
        best_gain=load.best_gain,
        levels=levels,
        arms=arms,
        lengths=(load.lengths or "").strip() or None,
        clocks=_clocks(load.clocks),
        preemptions={
            arm: count
            for arm in ARMS
            if (record := summary.arm(arm)) is not None
            and (count := finite_number(record.preemptions)) is not None
            and count >= 0
        },
        time_scale=time_scale(summary.control, summary.candidate),
    )


def _mhz(value: float | None) -> float | None:
    number = finite_number(value)
    return number if number is not None and 0.0 < number < MAX_MHZ else None


def _mhz_range(value: Sequence[float]) -> tuple[float, float] | None:
    pair = interval(value)  # finite numbers already
    return pair if pair is not None and 0.0 < pair[0] <= pair[1] < MAX_MHZ else None


def _clocks(raw: ClocksRecord | None) -> ClocksRecord | None:
    """`status.speed.clocks` with both arms, an unreadable clock None (shown "-"), never a guess."""
    if raw is None:
        return None

    def checked(block: ClockRecord | None) -> ClockRecord:
        block = block or ClockRecord()
        return ClockRecord(
            sm_mhz=_mhz(block.sm_mhz),
            sm_range_mhz=_mhz_range(block.sm_range_mhz) or (),
            mem_mhz=_mhz(block.mem_mhz),
            mem_range_mhz=_mhz_range(block.mem_range_mhz) or (),
        )

    return ClocksRecord(
        source=raw.source or None,
        control=checked(raw.control),
        candidate=checked(raw.candidate),
        note=raw.note.strip() or None if raw.note is not None else None,
    )


# ---------------------------------------------------------------- production and remediation


def read_preflight(status: StatusLike) -> list[str]:
    """One line each: production load against the KV pool, the checkpoint's KV scales, and the
    engine's advice for this model (status.preflight.advice)."""
    pre = typed_status(status).preflight
    if pre is None:
        return []
    lines: list[str] = []
    pressure = pre.pressure
    if pressure is not None:
        verdict = {True: "KV pool is the limit", False: "KV pool has room", None: None}[
            pressure.pressured
        ] or "pool pressure unknown"
        facts = []
        usage = finite_number(pressure.max_usage)
        if usage is not None:
            facts.append(f"KV usage up to {pct(usage)}")
        waiting = finite_number(pressure.mean_waiting)
        if waiting is not None:
            facts.append(f"{waiting:.1f} requests waiting on average")
        samples = integer(pressure.samples)
        if samples is not None:
            facts.append(f"{samples} samples")
        lines.append(f"{verdict}" + (f" ({', '.join(facts)})" if facts else ""))
    scales = pre.checkpoint_has_scales
    if scales is not None:
        lines.append(
            "checkpoint carries k/v scales"
            if scales
            else "checkpoint has no k/v scales: FP8 KV uses scale 1.0"
        )
    for note in pre.advice:  # the engine's own guidance, each with its source: not a gate
        lines.append(f"advice {note.code or '?'} (not a gate): {note.message or ''} "
                     f"[source: {note.source or 'unknown'}]")  # fmt: skip
    return lines


def read_remediation(status: RolloutStatus) -> list[str]:
    """`status.remediation`: both candidate attempts, the crash and the remedy applied."""
    rem = status.remediation
    if rem is None:
        return []
    first = rem.first_attempt or FirstAttempt()
    args = " ".join(rem.args)
    env_text = " and ".join(f"{k}={v}" for k, v in rem.env.items())
    remedy = " and ".join(p for p in (args, env_text) if p) or DASH
    crashed = (first.message or "crashed").split("; starting the candidate again")[0]
    return [
        f"attempt 1 ({first.attention_backend or 'backend unknown'}): {crashed}",
        f"attempt 2: {rem.code} remedied for {rem.engine} "
        f"{rem.engine_version} with {remedy}; gated like any other candidate",
    ]


# ---------------------------------------------------------------- verdict, timing, args


# The verdict's decision in the words a user reads (the enum values are the operator's own).
_DECISION_WORDS: Final = {
    "Promote": "promote",
    "RollBack": "roll back",
    "Hold": "hold for approval",
    "NotNeeded": "not needed",
}


_ALL_PASSED: Final = ("every gate passed", "all gates passed")


def read_verdict(status: StatusLike) -> str | None:
    """`status.verdict` as one line in plain words; None when its message only repeats
    `status.message` (the headline already says it)."""
    typed = typed_status(status)
    v = typed.verdict
    if v is None:
        return None
    message = v.message
    reused = (
        f" (reused from {v.reused_from}: its eval and load, the same verdict key)"
        if v.reused_from
        else ""
    )
    said = bool(message and typed.message and message in typed.message)  # by the headline
    if said or (str(v.decision).lower() == "promote" and message in _ALL_PASSED):  # #26
        return reused.strip(" ()") or None
    words = _DECISION_WORDS.get(v.decision or "", v.decision)
    if words and message:
        return f"{words}: {message}{reused}"
    return ((words or message or "") + reused) or None


def read_duration(status: StatusLike) -> str | None:
    """How long the rollout ran (startedAt to finishedAt), e.g. "4 min 12 s"."""
    typed = typed_status(status)
    seconds = between(typed.started_at, typed.finished_at)
    return None if seconds is None else duration(seconds)


def between(start_text: str | None, end: str | dt.datetime | None) -> float | None:
    """Seconds from `start_text` to `end`; None when either is missing or unreadable (a time
    without a zone is), when `end` has no zone, or when the end comes first."""
    start = parse_time(start_text)
    stop = end if isinstance(end, dt.datetime) else parse_time(end)
    if start is None or stop is None or stop.tzinfo is None:
        return None
    if stop < start:
        return None
    return (stop - start).total_seconds()


# The operator ends a message with "; remedy: <text>", or "; remedy for <engine> <version>:
# <text>" when the remedy comes from the engine version's facts.
_REMEDY = re.compile(r"; (remedy(?: for [^:;]+)?): ")


def split_remedy(message: str) -> tuple[str, str | None]:
    """("what happened", "what to do") from an operator message "...; remedy[ for E V]: ..."."""
    match = _REMEDY.search(message)
    if match is None:
        return message, None
    label = match.group(1)
    remedy = message[match.end() :]
    # "remedy for vllm 0.11.0: X" keeps the engine version it was chosen for.
    version = label.removeprefix("remedy").removeprefix(" for ")
    return message[: match.start()], f"{remedy} (for {version})" if version else remedy


def is_finished(status: RolloutStatus) -> bool:
    """The rollout ended (a final phase, or a finish time): what is missing now never comes."""
    return bool((status.phase is not None and status.phase.terminal) or status.finished_at)


# Phases a candidate reaches only after a passing verdict.
_PASSED: Final = frozenset(
    {
        Phase.AWAITING_APPROVAL,
        Phase.PROMOTING,
        Phase.VERIFYING,
        Phase.PULL_REQUEST_OPEN,
        Phase.PULL_REQUEST_MERGED,
        Phase.PROMOTED,
    }
)


def args_heading(status: StatusLike) -> str:
    """The args are a recommendation only once a verdict passed them; before that they are
    under test, a rejected candidate's args are labelled as such, and those of a rollout that
    failed before any verdict (a canary no node took) as not tested."""
    typed = typed_status(status)
    phase = typed.phase
    if phase is Phase.REVERTING:  # read as the end the revert record names (else rolled back)
        end = typed.revert.phase if typed.revert is not None else None
        phase = end if end in (Phase.NOT_NEEDED, Phase.FAILED) else Phase.ROLLED_BACK
    if phase is Phase.FAILED and typed.verdict is None:
        return "Candidate args (not tested)"
    if phase is not None and phase.value in BAD_PHASES:
        return "Rejected candidate args"
    if phase is Phase.NOT_NEEDED:
        return "Candidate args (not needed)"
    if phase in _PASSED or (typed.verdict is not None and typed.verdict.decision == "Promote"):
        return "Recommended args"
    return "Candidate args (under test)"


def read_progress(status: RolloutStatus, head: Header, now: dt.datetime) -> Progress | None:
    """How long an unfinished rollout has run (and been in its phase), and a running eval's
    latest look."""
    look = status.eval.look_progress if status.eval is not None else None
    evaluating = status.phase is Phase.EVALUATING
    running, phase_s = between(status.started_at, now), between(status.phase_since, now)
    if running is None and not (look and evaluating):
        return None
    if look is None or not evaluating:
        return Progress(running_s=running, phase_s=phase_s)
    return Progress(
        running_s=running,
        phase_s=phase_s,
        look=look.look,
        looks_planned=look.looks_planned,
        questions=look.questions,
        questions_planned=head.questions_planned,
        difference=look.difference,
    )
