"""Reads a rollout's status into the report's view model (the frozen records of `records`).

Pure: takes the rollout object as a dict (as `kubectl get kvr NAME -o json` prints it). This
is the only module of the report that reads the status dict; the renderers take its records.
Every status field is optional, because a report is asked for at any phase and an older
operator may not write every field; what is missing or unreadable is `None` (shown as "-"),
never guessed, and no value of any type raises. Keys are read in camelCase (the CRD) and,
where the eval summary is copied as is, snake_case.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, overload

from kvgate import manifests, verdict
from kvgate.model import Phase
from kvgate.report.fmt import DASH, pct
from kvgate.report.records import (
    Accuracy,
    ArmAccuracy,
    ArmCapacity,
    ArmClock,
    Clocks,
    DivergenceBucket,
    Finding,
    Header,
    LogLine,
    LongContextBucket,
    Speed,
    SpeedMetric,
)

ARMS: Final = manifests.ARMS
# kstatus conditions say how the object is doing, not what the gates found.
_KSTATUS: Final = frozenset({"Ready", "Reconciling", "Stalled"})
_GATE_ORDER: Final = {g: i for i, g in enumerate(verdict.GATE_ORDER)}  # the order gates run in
GOOD_PHASES: Final = frozenset({Phase.PROMOTED.value, Phase.NOT_NEEDED.value})
BAD_PHASES: Final = frozenset({Phase.ROLLED_BACK.value, Phase.FAILED.value})
WAIT_PHASES: Final = frozenset({Phase.AWAITING_APPROVAL.value})
# A GPU clock outside this is not a reading (a unit slip, a counter, a hostile edit).
_MAX_MHZ: Final = 100_000.0


# ---------------------------------------------------------------- reading fields


def _get(mapping: Any, *keys: str) -> Any:
    """The first present key of `keys` in `mapping` (camelCase first, then snake_case)."""
    if not isinstance(mapping, Mapping):
        return None
    for key in keys:
        if key in mapping and mapping[key] is not None:
            return mapping[key]
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            return None
        return number if math.isfinite(number) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _int(value: Any) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


def _interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, Mapping):
        value = [_get(value, "low", "lower"), _get(value, "high", "upper")]
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        low, high = _num(value[0]), _num(value[1])
        if low is not None and high is not None:
            return (low, high)
    return None


@overload
def as_fraction(value: float) -> float: ...
@overload
def as_fraction(value: float | None) -> float | None: ...
def as_fraction(value: float | None) -> float | None:
    """Accuracy may be a fraction (0.918) or a percentage (91.8); return a fraction."""
    if value is None:
        return None
    return value / 100.0 if value > 1.0 else value


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    """The mappings of a list (anything else in it, or a non-list, is left out)."""
    if not isinstance(value, list | tuple):
        return []
    return [v for v in value if isinstance(v, Mapping)]


# ---------------------------------------------------------------- accuracy


def read_accuracy(status: Mapping[str, Any]) -> Accuracy | None:
    """`status.accuracy` (the eval summary, camelCase or snake_case) as an `Accuracy`."""
    acc = _get(status, "accuracy")
    if not isinstance(acc, Mapping):
        return None
    arms: dict[str, ArmAccuracy] = {}
    for arm in ARMS:
        raw = _get(acc, arm)
        if not isinstance(raw, Mapping):
            continue
        correct, n = _int(_get(raw, "correct")), _int(_get(raw, "n", "total"))
        accuracy = as_fraction(_num(_get(raw, "accuracy")))
        if accuracy is None and correct is not None and n:
            accuracy = correct / n
        wilson = _interval(_get(raw, "wilson95", "wilson", "interval"))
        if wilson is not None and max(wilson) > 1.0:
            wilson = (wilson[0] / 100.0, wilson[1] / 100.0)
        arms[arm] = ArmAccuracy(correct, n, accuracy, wilson)
    paired = _get(acc, "paired")
    paired = paired if isinstance(paired, Mapping) else {}
    control_only = _int(_get(paired, "controlOnly", "control_only"))
    candidate_only = _int(_get(paired, "candidateOnly", "candidate_only"))
    advice = _get(acc, "advice")
    stopped = _get(acc, "stoppedEarly", "stopped_early")
    return Accuracy(
        verdict=_str_or_none(_get(acc, "verdict")),
        task=_str_or_none(_get(acc, "task")),
        margin=_num(_get(acc, "margin")),
        confidence=_num(_get(acc, "confidence")),
        questions_used=_int(_get(acc, "questionsUsed", "questions_used")),
        stopped_early=stopped if isinstance(stopped, bool) else None,
        arms=arms,
        difference=_difference(acc, paired),
        difference_ci=_interval(_get(paired, "tango95", "interval", "ci95")),
        mcnemar_p=_num(_get(paired, "mcnemarP", "mcnemar_p")),
        discordant=(
            (control_only, candidate_only)
            if control_only is not None and candidate_only is not None
            else None
        ),
        ruled_out=_num(_get(acc, "largestLossRuledOut", "largest_loss_ruled_out")),
        questions_needed=_int(_get(advice, "questionsNeeded", "questions_needed")),
        error=_str_or_none(_get(acc, "error")),
    )


def _difference(acc: Mapping[str, Any], paired: Mapping[str, Any]) -> float | None:
    """Candidate minus control as a fraction; the CRD's `differencePp` is in points."""
    points = _num(_get(acc, "differencePp"))
    if points is not None:
        return points / 100.0
    return _num(_get(paired, "difference"))


def _buckets(status: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """`status.accuracy.<key>.buckets`: the long-context or divergence rows."""
    accuracy = _get(status, "accuracy")
    block = accuracy.get(key) if isinstance(accuracy, Mapping) else None
    rows = block.get("buckets") if isinstance(block, Mapping) else None
    return _mappings(rows) if isinstance(rows, list) else []


def read_long_context(status: Mapping[str, Any]) -> list[LongContextBucket]:
    """Per context-length bucket: both arms' scores, recovery, the lower bound, the verdict."""
    return [
        LongContextBucket(
            context_length=_int(r.get("context_length")),
            control=_num(_get(r.get("control"), "accuracy")),
            candidate=_num(_get(r.get("candidate"), "accuracy")),
            recovery=_num(r.get("recovery")),
            lower=_num(_get(r.get("bounds"), "lower")),
            verdict=str(r.get("verdict", DASH)),
            reason=str(r.get("reason", DASH)),
        )
        for r in _buckets(status, "long_context")
    ]


def read_divergence(status: Mapping[str, Any]) -> list[DivergenceBucket]:
    """Per position bucket: the A/A floor and the candidate, KL and top-1 agreement."""
    out = []
    for r in _buckets(status, "divergence"):
        floor, cand = r.get("floor"), r.get("candidate")
        out.append(
            DivergenceBucket(
                bucket=str(r.get("bucket", DASH)),
                floor_kl=_num(_get(floor, "mean_kl")),
                candidate_kl=_num(_get(cand, "mean_kl")),
                floor_top1=_num(_get(floor, "top1_agreement")),
                candidate_top1=_num(_get(cand, "top1_agreement")),
                flagged=bool(r.get("flagged")),
            )
        )
    return out


# ---------------------------------------------------------------- findings and logs


def _conditions(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = _get(status, "conditions")
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return []
    return [c for c in raw if isinstance(c, Mapping)]


def _is_kstatus(condition: Mapping[str, Any]) -> bool:
    kind = condition.get("type")
    return isinstance(kind, str) and kind in _KSTATUS


def read_findings(status: Mapping[str, Any]) -> list[Finding]:
    """Gate results: `status.findings`, else `status.gates` (by gate name), else conditions."""
    raw = _get(status, "findings")
    found: list[Finding] = []
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        for item in raw:
            if isinstance(item, Mapping):
                found.append(_finding(str(_get(item, "gate", "type", "name") or DASH), item))
            elif isinstance(item, str):
                found.append(Finding(gate="Finding", status=DASH, reason="", message=item))
    gates = _get(status, "gates")
    if not found and isinstance(gates, Mapping):
        found = [_finding(str(k), v) for k, v in gates.items() if isinstance(v, Mapping)]
        # The order the gates run in; unknown names keep their place after them.
        found.sort(key=lambda f: _GATE_ORDER.get(f.gate, len(_GATE_ORDER)))
    if found:
        return found
    return [
        _finding(str(cond.get("type", DASH)), cond)
        for cond in _conditions(status)
        if not _is_kstatus(cond)
    ]


def _finding(gate: str, item: Mapping[str, Any]) -> Finding:
    return Finding(
        gate=gate,
        status=str(_get(item, "outcome", "status", "result", "verdict") or DASH),
        reason=str(_get(item, "reason") or ""),
        message=str(_get(item, "message") or ""),
    )


def _scan(status: Mapping[str, Any], arm: str) -> Mapping[str, Any]:
    """The arm's startup-log scan (`status.arms.<arm>.scan`), or {}."""
    scan = _get(_get(_get(status, "arms"), arm), "scan")
    return scan if isinstance(scan, Mapping) else {}


def read_log_findings(status: Mapping[str, Any]) -> list[LogLine]:
    """Warnings and errors from each arm's startup-log scan (info lines are left out)."""
    out: list[LogLine] = []
    for arm in ARMS:
        for f in _mappings(_get(_scan(status, arm), "findings")):
            if f.get("severity") not in ("warning", "error"):
                continue
            out.append(
                LogLine(
                    arm=arm,
                    severity=str(f["severity"]),
                    code=str(f.get("code") or ""),
                    text=str(f.get("text") or "").strip(),
                    hint=str(f.get("hint") or "").strip(),
                )
            )
    return out


# ---------------------------------------------------------------- capacity and speed


def _arm_block(status: Mapping[str, Any], section: str, arm: str) -> Mapping[str, Any]:
    """`status.<section>.<arm>`, falling back to `status.arms.<arm>`."""
    block = _get(_get(status, section), arm)
    if isinstance(block, Mapping):
        return block
    block = _get(_get(status, "arms"), arm)
    return block if isinstance(block, Mapping) else {}


def read_kv_tokens(status: Mapping[str, Any], arm: str) -> float | None:
    """The arm's KV cache size in tokens, as its engine reported it at startup."""
    block = _arm_block(status, "capacity", arm)
    tokens = _num(_get(block, "kvTokens", "kvCacheTokens", "kv_tokens", "tokens"))
    if tokens is None:
        tokens = _num(_get(_get(_get(status, "arms"), arm), "kvTokens"))
    if tokens is None:
        tokens = _num(_get(_get(_scan(status, arm), "capacity"), "kv_tokens"))
    return tokens


def read_capacity(status: Mapping[str, Any]) -> list[ArmCapacity]:
    """Each arm with any KV figure: dtype, attention backend, KV tokens, max concurrency."""
    out: list[ArmCapacity] = []
    for arm in ARMS:
        block = _arm_block(status, "capacity", arm)
        scan = _scan(status, arm)
        dtype = _get(block, "kvCacheDtype", "kvDtype", "kv_cache_dtype", "dtype") or _get(
            scan, "kv_cache_dtype"
        )
        tokens = read_kv_tokens(status, arm)
        conc = _num(_get(block, "maxConcurrency", "max_concurrency"))
        if conc is None:
            conc = _num(_get(_get(scan, "capacity"), "max_concurrency"))
        backend = (
            _get(block, "attentionBackend", "backend")
            or _get(_get(_get(status, "arms"), arm), "attentionBackend")
            or _get(scan, "attention_backend")
        )
        if dtype is None and tokens is None and conc is None and backend is None:
            continue
        out.append(ArmCapacity(arm, _str_or_none(dtype), _str_or_none(backend), tokens, conc))
    return out


def read_capacity_gain(status: Mapping[str, Any]) -> float | None:
    """Candidate KV tokens over control KV tokens (from the status, else computed)."""
    gain = _num(_get(_get(status, "capacity"), "gain", "ratio", "kvTokensRatio"))
    if gain is not None:
        return gain
    control, candidate = read_kv_tokens(status, "control"), read_kv_tokens(status, "candidate")
    if control and candidate is not None:
        return candidate / control
    return None


def read_speed(status: Mapping[str, Any]) -> Speed | None:
    """`status.speed`: the numeric figures per arm (whatever the operator measured), and clocks."""
    speed = _get(status, "speed")
    if not isinstance(speed, Mapping):
        return None
    blocks = {arm: _get(speed, arm) for arm in ARMS}
    keys: list[Any] = []
    for block in blocks.values():
        if isinstance(block, Mapping):
            keys.extend(k for k, v in block.items() if _num(v) is not None and k not in keys)
    metrics = [
        SpeedMetric(
            str(key),
            {
                arm: _num(block.get(key)) if isinstance(block, Mapping) else None
                for arm, block in blocks.items()
            },
        )
        for key in keys
    ]
    return Speed(metrics=metrics, clocks=_clocks(_get(speed, "clocks")))


def _mhz(value: Any) -> float | None:
    number = _num(value)
    return number if number is not None and 0.0 < number <= _MAX_MHZ else None


def _mhz_range(value: Any) -> tuple[float, float] | None:
    pair = _interval(value)
    if pair is None:
        return None
    low, high = _mhz(pair[0]), _mhz(pair[1])
    return (low, high) if low is not None and high is not None and low <= high else None


def _clocks(raw: Any) -> Clocks | None:
    """`status.speed.clocks`; an unreadable clock is None (shown "-"), never a guess."""
    if not isinstance(raw, Mapping):
        return None
    arms = {}
    for arm in ARMS:
        block = _get(raw, arm)
        arms[arm] = ArmClock(
            sm_mhz=_mhz(_get(block, "smMHz", "sm_mhz")),
            mem_mhz=_mhz(_get(block, "memMHz", "mem_mhz")),
            sm_range=_mhz_range(_get(block, "smRangeMHz", "sm_range_mhz")),
            mem_range=_mhz_range(_get(block, "memRangeMHz", "mem_range_mhz")),
        )
    source, note = _get(raw, "source"), _get(raw, "note")
    return Clocks(
        arms=arms,
        source=source if isinstance(source, str) and source else None,
        note=note.strip() or None if isinstance(note, str) else None,
    )


# ---------------------------------------------------------------- production and remediation


def read_preflight(status: Mapping[str, Any]) -> list[str]:
    """One line each: production load against the KV pool, and the checkpoint's KV scales."""
    pre = _get(status, "preflight")
    lines: list[str] = []
    pressure = _get(pre, "pressure")
    if isinstance(pressure, Mapping):
        pressured = _get(pressure, "pressured")
        verdicts: dict[object, str] = {True: "KV pool is the limit", False: "KV pool has room"}
        # 1 and 0 read as True and False, as they always have; a list or a dict is unknown.
        verdict = verdicts.get(
            pressured if isinstance(pressured, int | float | str) else None,
            "pool pressure unknown",
        )
        facts = []
        usage = _num(_get(pressure, "max_usage", "maxUsage"))
        if usage is not None:
            facts.append(f"KV usage up to {pct(usage)}")
        waiting = _num(_get(pressure, "mean_waiting", "meanWaiting"))
        if waiting is not None:
            facts.append(f"{waiting:.1f} requests waiting on average")
        samples = _int(_get(pressure, "samples"))
        if samples is not None:
            facts.append(f"{samples} samples")
        lines.append(f"{verdict}" + (f" ({', '.join(facts)})" if facts else ""))
    scales = _get(pre, "checkpointHasScales", "checkpoint_has_scales")
    if isinstance(scales, bool):
        lines.append(
            "checkpoint carries k/v scales"
            if scales
            else "checkpoint has no k/v scales: FP8 KV uses scale 1.0"
        )
    return lines


def read_remediation(status: Mapping[str, Any]) -> list[str]:
    """`status.remediation`: both candidate attempts, the crash and the remedy applied."""
    rem = _get(status, "remediation")
    if not isinstance(rem, Mapping):
        return []
    first = _get(rem, "firstAttempt") or {}
    first = first if isinstance(first, Mapping) else {}
    raw_args = _get(rem, "args") or []
    args = " ".join(str(a) for a in (raw_args if isinstance(raw_args, Iterable) else []))
    env = _get(rem, "env") or {}
    env_text = " and ".join(f"{k}={v}" for k, v in env.items()) if isinstance(env, Mapping) else ""
    remedy = " and ".join(p for p in (args, env_text) if p) or DASH
    crashed = str(_get(first, "message") or "crashed").split("; starting the candidate again")[0]
    return [
        f"attempt 1 ({_get(first, 'attentionBackend') or 'backend unknown'}): {crashed}",
        f"attempt 2: {_get(rem, 'code')} remedied for {_get(rem, 'engine')} "
        f"{_get(rem, 'engineVersion')} with {remedy}; gated like any other candidate",
    ]


# ---------------------------------------------------------------- verdict, timing, args


def read_verdict(status: Mapping[str, Any]) -> str | None:
    """`status.verdict`: the decision and why, as one line."""
    v = _get(status, "verdict")
    if not isinstance(v, Mapping):
        return None
    decision = _get(v, "decision")
    message = _get(v, "message")
    if decision and message:
        return f"{decision}: {message}"
    return _str_or_none(decision or message)


def read_duration(status: Mapping[str, Any]) -> str | None:
    """How long the rollout ran (startedAt to finishedAt), e.g. "4 min 12 s"."""

    def parse(text: Any) -> dt.datetime | None:
        if not isinstance(text, str):
            return None
        try:
            return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None

    start, end = parse(_get(status, "startedAt")), parse(_get(status, "finishedAt"))
    if start is None or end is None or (start.tzinfo is None) != (end.tzinfo is None):
        return None  # missing, or one with a zone and one without: not comparable
    if end < start:
        return None
    seconds = int((end - start).total_seconds())
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


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


def is_finished(status: Mapping[str, Any]) -> bool:
    """The rollout ended (a final phase, or a finish time): what is missing now never comes."""
    phase = _get(status, "phase")
    ended = isinstance(phase, str) and phase in (GOOD_PHASES | BAD_PHASES)
    return bool(ended or _get(status, "finishedAt"))


def args_heading(status: Mapping[str, Any]) -> str:
    """The args are a recommendation only when the candidate was not rejected."""
    phase = _get(status, "phase")
    bad = isinstance(phase, str) and phase in BAD_PHASES
    return "Rejected candidate args" if bad else "Recommended args"


def read_recommended_args(status: Mapping[str, Any]) -> list[str]:
    raw = _get(status, "recommendedArgs", "recommended_args")
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, Sequence):
        return [str(a) for a in raw]
    return []


# ---------------------------------------------------------------- identity


def read_status(rollout: Mapping[str, Any]) -> Mapping[str, Any]:
    """`rollout.status`, or {} (a fresh rollout has none; a hand-edited one may hold anything)."""
    status = _get(rollout, "status") or {}
    return status if isinstance(status, Mapping) else {}


def read_header(rollout: Mapping[str, Any]) -> Header:
    """Identity, target, promotion mode, candidate dtype, phase and the message to show."""
    spec = _get(rollout, "spec") or {}
    status = read_status(rollout)
    meta = _get(rollout, "metadata") or {}
    message = _get(status, "message")
    ready = next((c for c in _conditions(status) if c.get("type") == "Ready"), None)
    message = message or (ready.get("message") if ready is not None else None)
    return Header(
        namespace=str(_get(meta, "namespace") or DASH),
        name=str(_get(meta, "name") or DASH),
        target=_target(spec),
        mode=_str_or_none(_get(_get(spec, "promotion"), "mode") or _get(spec, "mode")),
        kv_cache_dtype=str(dtype) if (dtype := _get(spec, "kvCacheDtype")) else None,
        phase=str(_get(status, "phase") or "Pending"),
        message=str(message) if message else None,
    )


def _target(spec: Mapping[str, Any]) -> str:
    ref = _get(spec, "targetRef", "target", "deployment")
    if isinstance(ref, Mapping):
        kind = _get(ref, "kind") or "Deployment"
        return f"{kind}/{_get(ref, 'name') or DASH}"
    return str(ref) if ref else DASH
