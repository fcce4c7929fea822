"""Evidence in, decision out: the gates, `decide`, and the transition function `next_step`.

Every gate turns its evidence into a `GateResult` (an `Outcome`, an event reason and a message).
`decide` takes the worst outcome: any FAILED, ERROR or INCONCLUSIVE rolls back, listing every
reason; missing evidence is ERROR or PENDING and never promotes (fail closed).
`next_step` is the one state machine: given the spec, what status says and what the handler
observed now, it returns the next phase, the actions to take, events and the requeue delay.
Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final

from kvgate.model import (
    PATCHED_PHASES,
    AccuracyGate,
    ArmClocks,
    BackendGate,
    CapacityGainGate,
    CapacityGate,
    DivergenceGate,
    GateMode,
    LongContextTask,
    Outcome,
    Phase,
    PromotionMode,
    Remediation,
    RolloutSpec,
    ScalesGate,
    SpeedClocks,
    SpeedGate,
    worst,
)

# Gate names, as keys of `status.gates`.
POOL: Final = "poolPressure"
SCALES: Final = "scales"
BACKEND: Final = "backend"
CAPACITY_GAIN: Final = "capacityGain"
ACCURACY: Final = "accuracy"
LONG_CONTEXT: Final = "longContext"
DIVERGENCE: Final = "divergence"
SPEED: Final = "speed"
CANARY: Final = "canary"
ENGINE_TRUTH: Final = "engineTruth"
GATE_ORDER: Final = (
    POOL, SCALES, CANARY, ENGINE_TRUTH, BACKEND, CAPACITY_GAIN, ACCURACY, LONG_CONTEXT,
    DIVERGENCE, SPEED,
)  # fmt: skip
EVAL_GATES: Final = frozenset({ACCURACY, LONG_CONTEXT, DIVERGENCE, SPEED})

_GENERIC_FAILURES: Final = frozenset({"engine-start-failed"})
KV_SCALE_DEFAULT: Final = "kv-scale-default"  # logs.py: the engine fell back to scale 1.0
MIN_DELAY_S: Final = 1.0
EVAL_GRACE_S: Final = 60.0  # scheduling and Job-controller slack on top of the eval attempts
MAX_DELAY_S: Final = 30.0


class Decision(StrEnum):
    PROMOTE = "Promote"
    ROLL_BACK = "RollBack"
    HOLD = "Hold"
    NOT_NEEDED = "NotNeeded"


class Action(StrEnum):
    CREATE_CANARIES = "CreateCanaries"
    DELETE_CANARIES = "DeleteCanaries"
    CREATE_EVAL_JOB = "CreateEvalJob"
    DELETE_EVAL_JOB = "DeleteEvalJob"
    SNAPSHOT_SPEED = "SnapshotSpeed"
    PATCH_DEPLOYMENT = "PatchDeployment"
    REVERT_DEPLOYMENT = "RevertDeployment"
    REMEDIATE = "Remediate"  # record the step's remedy and the remedied candidate in status


@dataclass(frozen=True, slots=True)
class GateResult:
    gate: str
    outcome: Outcome
    reason: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"outcome": self.outcome.value, "reason": self.reason, "message": self.message}

    @classmethod
    def from_dict(cls, gate: str, data: Mapping[str, Any]) -> GateResult:
        try:
            outcome = Outcome(data.get("outcome", "Error"))
        except ValueError:
            outcome = Outcome.ERROR  # unreadable status never promotes
        return cls(gate, outcome, str(data.get("reason", "")), str(data.get("message", "")))


# --- gates ------------------------------------------------------------------------------------


def assess_pool(gate: CapacityGate, pressured: bool | None, detail: str) -> GateResult:
    """Is the KV pool the limit? Room plus `require` means the change is not needed."""
    if gate.mode is GateMode.OFF:
        return GateResult(POOL, Outcome.SKIPPED, "GateOff", "pool pressure not checked (mode off)")
    if pressured is True:
        return GateResult(
            POOL, Outcome.SUCCESSFUL, "PoolPressured", f"KV pool is the limit: {detail}"
        )
    if pressured is False:
        if gate.mode is GateMode.REQUIRE:
            return GateResult(
                POOL,
                Outcome.NOT_NEEDED,
                "PoolHasRoom",
                f"KV pool has room: {detail}; an FP8 KV cache buys nothing here",
            )
        return GateResult(POOL, Outcome.WARNING, "PoolHasRoom", f"KV pool has room: {detail}")
    if gate.mode is GateMode.REQUIRE:
        return GateResult(
            POOL,
            Outcome.ERROR,
            "PoolPressureUnknown",
            f"could not tell whether the KV pool is the limit: {detail}",
        )
    return GateResult(
        POOL, Outcome.WARNING, "PoolPressureUnknown", f"pool pressure unknown: {detail}"
    )


def scale_warnings(scan: Mapping[str, Any] | None) -> list[str]:
    """Texts of the KV-scale warnings in a log scan (`LogScan.to_dict()`)."""
    if not scan:
        return []
    # Only k/v scales count: a missing q scale is printed even when k/v scales were loaded.
    return [
        str(f.get("text") or f.get("code"))
        for f in scan.get("findings") or []
        if f.get("code") == KV_SCALE_DEFAULT
    ]


def assess_scales(
    gate: ScalesGate, checkpoint_has_scales: bool | None, candidate_scan: Mapping[str, Any] | None
) -> GateResult:
    """KV scales: from the checkpoint scan and the candidate's startup log.

    A checkpoint with scales whose candidate still warns means the loader dropped them: that is
    ScalesDropped, a separate and louder finding than ScalesMissing.
    """
    if gate.mode is GateMode.OFF:
        return GateResult(SCALES, Outcome.SKIPPED, "GateOff", "KV scales not checked (mode off)")
    warned = scale_warnings(candidate_scan)
    bad = Outcome.FAILED if gate.mode is GateMode.REQUIRE else Outcome.WARNING
    if checkpoint_has_scales is True and (candidate_scan or {}).get("engine") == "sglang":
        # SGLang prints its 1.0 warning without --quantization-param-path even when it loaded
        # the checkpoint's per-layer scales (sglang#31224): the checkpoint scan is the evidence.
        return GateResult(
            SCALES, Outcome.SUCCESSFUL, "ScalesPresent", "checkpoint has k/v scales for every layer"
        )
    if checkpoint_has_scales is True and warned:
        return GateResult(
            SCALES,
            bad,
            "ScalesDropped",
            f"checkpoint has KV scales but the candidate warns they were not used: {warned[0]}",
        )
    if checkpoint_has_scales is False or warned:
        why = warned[0] if warned else "the checkpoint scan found no k/v scales"
        return GateResult(
            SCALES, bad, "ScalesMissing", f"no KV scales: FP8 KV uses scale 1.0 ({why})"
        )
    if candidate_scan is None:
        if gate.mode is GateMode.REQUIRE:
            return GateResult(
                SCALES, Outcome.PENDING, "ScalesUnknown", "waiting for the candidate log"
            )
        return GateResult(SCALES, Outcome.PENDING, "ScalesUnknown", "waiting for the candidate log")
    return GateResult(
        SCALES, Outcome.SUCCESSFUL, "ScalesPresent", "no KV-scale warning; scales used"
    )


def assess_backend(
    gate: BackendGate,
    control_scan: Mapping[str, Any] | None,
    candidate_scan: Mapping[str, Any] | None,
) -> GateResult:
    """The candidate's attention backend: allowed, and whether it changed from the control's."""
    if control_scan is None or candidate_scan is None:
        return GateResult(
            BACKEND, Outcome.PENDING, "BackendUnknown", "waiting for both startup logs"
        )
    control = control_scan.get("attention_backend")
    candidate = candidate_scan.get("attention_backend")
    if candidate is None:
        return GateResult(
            BACKEND,
            Outcome.WARNING if not gate.allowed else Outcome.ERROR,
            "BackendUnknown",
            "the candidate's startup log names no attention backend",
        )
    if gate.allowed and candidate not in gate.allowed:
        return GateResult(
            BACKEND,
            Outcome.FAILED,
            "BackendNotAllowed",
            f"candidate uses {candidate}, not one of {', '.join(gate.allowed)}",
        )
    if control is not None and control != candidate:
        message = (
            f"attention backend changed from {control} to {candidate}: "
            "two things changed at once (KV dtype and kernel)"
        )
        outcome = Outcome.WARNING if gate.allow_fallback else Outcome.FAILED
        return GateResult(BACKEND, outcome, "BackendChanged", message)
    return GateResult(BACKEND, Outcome.SUCCESSFUL, "BackendUnchanged", f"both arms use {candidate}")


def _fp8_family(dtype: str | None) -> str | None:
    """`fp8` and `fp8_e4m3` are the same cache on CUDA; `fp8_e5m2` is another."""
    if not dtype:
        return None
    return "fp8_e5m2" if dtype == "fp8_e5m2" else ("fp8_e4m3" if dtype.startswith("fp8") else dtype)


def assess_arms_dtype(
    wanted: str, control_scan: Mapping[str, Any], candidate_scan: Mapping[str, Any]
) -> GateResult:
    """Both arms Ready, and each runs the KV dtype it should: else the comparison is void."""
    control = control_scan.get("kv_cache_dtype")
    candidate = candidate_scan.get("kv_cache_dtype")
    if _fp8_family(candidate) != _fp8_family(wanted):
        return GateResult(
            CANARY,
            Outcome.ERROR,
            "CandidateDtypeMismatch",
            f"the candidate's log shows KV cache dtype {candidate or 'unknown'}, not {wanted}",
        )
    if control is not None and _fp8_family(control) == _fp8_family(wanted):
        return GateResult(
            CANARY,
            Outcome.ERROR,
            "ControlDtypeMismatch",
            f"the control already runs KV cache dtype {control}: nothing to compare",
        )
    return GateResult(
        CANARY, Outcome.SUCCESSFUL, "CanaryHealthy", f"both arms Ready; candidate runs {candidate}"
    )


def assess_engine_truth(
    scans: Mapping[str, Mapping[str, Any]], truths: Mapping[str, Mapping[str, Any]]
) -> GateResult:
    """Each arm's startup log against its own /metrics (`metrics.cache_truth`); fail closed.

    `scans` and `truths` are keyed by arm. SGLang's /metrics carry no KV dtype: its dtype is
    checked against its server info's `kv_cache_dtype` (`serverInfo` in the truth) instead.
    Any disagreement (KV dtype, KV tokens, GPU blocks)
    is an ERROR naming the arm and both values: the pod does not run what one source claims,
    so neither arm's evidence can be trusted. A candidate whose metrics give neither dtype
    nor capacity (an engine that exports no cache info) is a WARNING: the log stands alone.
    """
    from kvgate import logs, metrics

    problems: list[str] = []
    compared: dict[str, list[str]] = {}
    for arm in ("candidate", "control"):
        scan = logs.LogScan.from_dict(scans.get(arm) or {})
        truth = truths.get(arm) or {}
        snapshot = metrics.snapshot_from_cache_truth(truth)
        problems.extend(f"{arm}: {f.text}" for f in metrics.cross_check_log(scan, snapshot))
        info = metrics.ServerInfo.from_status(truth.get("serverInfo"))
        server_dtype = info.kv_cache_dtype if info else None
        server_tokens = info.max_total_num_tokens if info else None
        problems.extend(
            f"{arm}: {f.text}"
            for f in metrics.cross_check_server_info(scan, server_dtype, server_tokens)
        )
        what = compared.setdefault(arm, [])
        if scan.kv_cache_dtype and snapshot.kv_cache_dtype:
            what.append("KV dtype")
        if scan.kv_cache_dtype and server_dtype:
            what.append("KV dtype (server info)")
        if scan.capacity.kv_tokens and server_tokens:
            what.append("KV tokens (server info)")
        if scan.capacity.kv_tokens and snapshot.kv_capacity_tokens:
            what.append("KV tokens")
    if problems:
        return GateResult(
            ENGINE_TRUTH,
            Outcome.ERROR,
            "LogMetricsDisagree",
            "startup log and /metrics disagree: " + "; ".join(problems),
        )
    detail = "; ".join(f"{arm}: {', '.join(w) or 'nothing'}" for arm, w in compared.items())
    if not compared["candidate"]:
        return GateResult(
            ENGINE_TRUTH,
            Outcome.WARNING,
            "MetricsSilent",
            "the candidate's /metrics give no KV dtype or capacity to check its log against",
        )
    return GateResult(
        ENGINE_TRUTH, Outcome.SUCCESSFUL, "LogMetricsAgree", f"log and /metrics agree ({detail})"
    )


def kv_tokens(scan: Mapping[str, Any] | None) -> int | None:
    """KV tokens from a log scan's `capacity.kv_tokens`."""
    if not scan:
        return None
    capacity = scan.get("capacity") or {}
    value = capacity.get("kv_tokens") if isinstance(capacity, Mapping) else None
    return int(value) if isinstance(value, int | float) and value > 0 else None


def assess_capacity_gain(
    gate: CapacityGainGate, control_tokens: int | None, candidate_tokens: int | None
) -> GateResult:
    """Candidate KV tokens over control KV tokens against the minimum ratio."""
    if control_tokens is None or candidate_tokens is None:
        missing = "control" if control_tokens is None else "candidate"
        return GateResult(
            CAPACITY_GAIN,
            Outcome.ERROR,
            "CapacityUnknown",
            f"the {missing} startup log gives no KV cache size",
        )
    ratio = candidate_tokens / control_tokens
    detail = f"{candidate_tokens:,} / {control_tokens:,} KV tokens = {ratio:.2f}x"
    if ratio < gate.min_ratio:
        return GateResult(
            CAPACITY_GAIN,
            Outcome.FAILED,
            "CapacityNotGained",
            f"{detail}, below the minimum {gate.min_ratio:g}x",
        )
    return GateResult(CAPACITY_GAIN, Outcome.SUCCESSFUL, "CapacityGained", detail)


def assess_accuracy(gate: AccuracyGate, summary: Mapping[str, Any] | None) -> GateResult:
    """The eval summary's verdict (pass / fail / inconclusive / error) as an outcome."""
    if summary is None:
        return GateResult(
            ACCURACY, Outcome.PENDING, "AccuracyPending", "accuracy not evaluated yet"
        )
    verdict = summary.get("verdict")
    detail = accuracy_detail(summary)
    if verdict == "pass":
        return GateResult(ACCURACY, Outcome.SUCCESSFUL, "AccuracyNonInferior", detail)
    if verdict == "fail":
        return GateResult(ACCURACY, Outcome.FAILED, "AccuracyRegressed", detail)
    if verdict == "inconclusive":
        advice = summary.get("advice")
        needed = advice.get("questions_needed") if isinstance(advice, Mapping) else None
        more = f"; about {needed} questions would decide" if needed else ""
        return GateResult(ACCURACY, Outcome.INCONCLUSIVE, "AccuracyInconclusive", detail + more)
    error = (
        summary.get("error") or f"eval summary verdict {verdict!r} is not pass/fail/inconclusive"
    )
    return GateResult(ACCURACY, Outcome.ERROR, "EvalError", str(error))


def accuracy_detail(summary: Mapping[str, Any]) -> str:
    """The accuracy evidence in one line, with the one-sided bound the decision rests on.

    `control 91.0% vs candidate 90.5%, difference -0.5 pp; at least -1.9 pp (95% one-sided,
    adjusted for 4 looks) (margin 2 pp, n=200)`. Summaries without look-adjusted bounds
    (older eval images) show the two-sided interval, labelled as such.
    """
    try:
        c, k = summary["control"], summary["candidate"]
        paired = summary.get("paired") or {}
        diff = float(paired["difference"]) * 100
        margin = float(summary.get("margin", 0)) * 100
        head = (
            f"control {float(c['accuracy']) * 100:.1f}% vs candidate "
            f"{float(k['accuracy']) * 100:.1f}%, difference {diff:+.1f} pp"
        )
        tail = f"(margin {margin:g} pp, n={summary.get('questions_used')})"
        bounds = summary.get("bounds")
        if isinstance(bounds, Mapping) and isinstance(bounds.get("lower"), int | float):
            adjusted = (
                f", adjusted for {bounds.get('look')} looks" if bounds.get("look_adjusted") else ""
            )
            sure = float(bounds.get("lower_confidence") or 0.95) * 100
            text = f"{head}; at least {float(bounds['lower']) * 100:+.1f} pp ({sure:g}% one-sided{adjusted})"
            if summary.get("verdict") == "fail" and isinstance(bounds.get("upper"), int | float):
                text += f", at most {float(bounds['upper']) * 100:+.1f} pp"
            return f"{text} {tail}"
        low, high = (float(x) * 100 for x in paired.get("tango95") or (float("nan"),) * 2)
        return f"{head} [{low:+.1f}, {high:+.1f}] (two-sided 95%) {tail}"
    except (KeyError, TypeError, ValueError):
        return f"eval verdict {summary.get('verdict')!r}"


_LC_KIND: Final = "kvgate.eval/long_context"
_LC_VERDICTS: Final = {
    "fail": (Outcome.FAILED, "LongContextRegressed"),
    "inconclusive": (Outcome.INCONCLUSIVE, "LongContextInconclusive"),
}


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def bucket_label(length: int) -> str:
    """A context-length bucket as a range: 32768 -> `16k-32k` (its prompts fill up to 32k)."""
    return f"{_tokens(length // 2)}-{_tokens(length)}"


def assess_long_context(gate: LongContextTask | None, summary: Mapping[str, Any]) -> GateResult:
    """The eval summary's `long_context` block as the long-context task's outcome.

    Fail closed: when the task was asked for, a missing, malformed or self-contradicting block
    (a pass with a bucket that did not pass, other tasks than asked) is an ERROR, never a pass.
    A fail or inconclusive names the worst bucket: of those with the block's verdict, the one
    where the candidate lost most.
    """
    if gate is None:
        return GateResult(LONG_CONTEXT, Outcome.SKIPPED, "GateOff", "long context not evaluated")
    block = summary.get("long_context")

    def broken(why: str) -> GateResult:
        return GateResult(LONG_CONTEXT, Outcome.ERROR, "LongContextError", why)

    if not isinstance(block, Mapping) or block.get("kind") != _LC_KIND:
        return broken(
            "the eval summary has no long_context block, though spec.gates.accuracy.longContext "
            "asks for it (an eval image without the task?)"
        )
    verdict = block.get("verdict")
    if verdict == "error" or verdict not in ("pass", "fail", "inconclusive"):
        return broken(f"long-context task: {block.get('error') or f'verdict {verdict!r}'}")
    if list(block.get("tasks") or []) != list(gate.tasks):
        return broken(
            f"long-context block ran tasks {block.get('tasks')!r}, not {list(gate.tasks)}"
        )
    if gate.context_lengths and list(block.get("context_lengths") or []) != list(
        gate.context_lengths
    ):
        return broken(
            f"long-context block judged lengths {block.get('context_lengths')!r}, not "
            f"{list(gate.context_lengths)}"
        )
    rows = block.get("buckets")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, Mapping) for r in rows):
        return broken("long-context block judged no bucket")
    try:
        worst_rows = [r for r in rows if r["verdict"] == verdict]
        if (verdict == "pass" and len(worst_rows) != len(rows)) or not worst_rows:
            return broken(f"long-context verdict {verdict} contradicts its buckets")
        row = min(worst_rows, key=lambda r: float(r["paired"]["difference"]))
        length = int(row["context_length"])
        detail = (
            f"control {float(row['control']['accuracy']):.0%} vs candidate "
            f"{float(row['candidate']['accuracy']):.0%} on {int(row['items'])} items"
        )
        recovery = row.get("recovery")
        if isinstance(recovery, int | float):
            detail += f", recovery {recovery:.2f} (floor {gate.recovery_floor:g})"
        lower = float(row["bounds"]["lower"]) * 100
    except (KeyError, TypeError, ValueError) as exc:
        return broken(f"long-context block is malformed ({type(exc).__name__}: {exc})")
    if verdict == "pass":
        lengths = ", ".join(bucket_label(int(r["context_length"])) for r in rows)
        return GateResult(
            LONG_CONTEXT,
            Outcome.SUCCESSFUL,
            "LongContextNonInferior",
            f"long context non-inferior in every bucket ({lengths}); closest: "
            f"{bucket_label(length)} {detail}, at least {lower:+.1f} pp "
            f"(margin {gate.margin_pp:g} pp)",
        )
    outcome, reason = _LC_VERDICTS[verdict]
    why = {
        "worse_than_margin": f"worse than the {gate.margin_pp:g} pp margin",
        "below_recovery_floor": f"below {gate.recovery_floor:.0%} of the control's score",
    }.get(str(row.get("reason")), "not shown non-inferior")
    return GateResult(
        LONG_CONTEXT,
        outcome,
        reason,
        f"long-context bucket {bucket_label(length)} ({length:,} tokens): {why}: {detail}",
    )


_DIV_KIND: Final = "kvgate.diverge/summary"


def assess_divergence(gate: DivergenceGate, summary: Mapping[str, Any]) -> GateResult:
    """The eval summary's `divergence` block (the screen's own summary) as an outcome.

    `require`: a flag fails, and a screen that did not run (missing block, error) is an ERROR;
    `warn`: both are WARNINGs. The message names the first flagged position bucket.
    """
    if gate.mode is GateMode.OFF:
        return GateResult(DIVERGENCE, Outcome.SKIPPED, "GateOff", "divergence not screened")
    bad = Outcome.FAILED if gate.mode is GateMode.REQUIRE else Outcome.WARNING
    unknown = Outcome.ERROR if gate.mode is GateMode.REQUIRE else Outcome.WARNING
    block = summary.get("divergence")
    if not isinstance(block, Mapping) or block.get("kind") != _DIV_KIND:
        return GateResult(
            DIVERGENCE,
            unknown,
            "DivergenceUnknown",
            "the eval summary has no divergence block, though spec.gates.divergence asks for it",
        )
    verdict = block.get("verdict")
    if verdict == "pass":
        try:
            rows = list(block["buckets"])
            positions = int(block["positions"])
            ok = bool(rows) and positions > 0 and not any(r["flagged"] for r in rows)
        except (KeyError, TypeError, ValueError):
            ok = False
        if ok:
            return GateResult(
                DIVERGENCE,
                Outcome.SUCCESSFUL,
                "DivergenceWithinFloor",
                f"token divergence within {gate.factor:g}x the A/A floor in every position "
                f"bucket ({positions:,} positions)",
            )
        return GateResult(
            DIVERGENCE, unknown, "DivergenceUnknown", "divergence pass contradicts its buckets"
        )
    if verdict == "flag":
        first = block.get("first_flagged")
        try:
            assert isinstance(first, Mapping)
            f, c = first["floor"], first["candidate"]
            message = (
                f"token divergence above {gate.factor:g}x the A/A floor from position bucket "
                f"{int(first['low']):,}-{int(first['high']):,}: mean KL "
                f"{float(c['mean_kl']):.3g} vs floor {float(f['mean_kl']):.3g}, top-1 agreement "
                f"{float(c['top1_agreement']):.0%} vs {float(f['top1_agreement']):.0%}"
            )
        except (AssertionError, KeyError, TypeError, ValueError):
            flagged = block.get("flagged_buckets")
            message = f"token divergence above the A/A floor in position buckets {flagged!r}"
        return GateResult(DIVERGENCE, bad, "DivergenceFlagged", message)
    return GateResult(
        DIVERGENCE,
        unknown,
        "DivergenceUnknown",
        f"divergence screen: {block.get('error') or f'verdict {verdict!r}'}",
    )


def mean_between(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> float | None:
    """Mean of a histogram over a window from its {sum, count} totals at both ends."""
    try:
        count = float(after["count"]) - float(before["count"])  # type: ignore[index]
        total = float(after["sum"]) - float(before["sum"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    return total / count if count > 0 and total >= 0 else None


_CLOCK_NAMES: Final = (("sm", "SM"), ("mem", "memory"))


def compare_clocks(control: ArmClocks, candidate: ArmClocks, tolerance: float) -> str | None:
    """Why the two arms' speeds cannot be compared (None: same clocks within `tolerance`).

    Each clock both arms report is compared by its window mean, and each arm's own range
    must stay within the tolerance too (a clock that throttled mid-window is not one clock).
    """
    problems: list[str] = []
    for key, label in _CLOCK_NAMES:
        a, b = getattr(control, key), getattr(candidate, key)
        if a is None or b is None:
            continue
        apart = abs(a.mean - b.mean) / max(a.mean, b.mean)
        if apart > tolerance:
            problems.append(
                f"{label} clock {b.mean:,.0f} MHz on the candidate vs {a.mean:,.0f} MHz on the "
                f"control ({apart:.0%} apart, tolerance {tolerance:.0%})"
            )
            continue
        for arm, r in (("control", a), ("candidate", b)):
            if (r.high - r.low) / r.high > tolerance:
                problems.append(
                    f"the {arm}'s {label} clock varied {r.low:,.0f}-{r.high:,.0f} MHz in the "
                    f"window (more than {tolerance:.0%})"
                )
    return "; ".join(problems) or None


def assess_speed(
    gate: SpeedGate | None,
    control_tpot_s: float | None,
    candidate_tpot_s: float | None,
    clocks: SpeedClocks | None = None,
) -> GateResult:
    """Candidate TPOT against control TPOT under the same load, at the same GPU clocks.

    Clocks that differ make the comparison worthless either way: no speed claim, and the
    gate (asked for, so required) is Inconclusive. Unknown clocks (no DCGM in Prometheus)
    leave the claim standing and say so.
    """
    if gate is None:
        return GateResult(SPEED, Outcome.SKIPPED, "GateOff", "speed not checked")
    if not control_tpot_s or candidate_tpot_s is None:
        return GateResult(SPEED, Outcome.ERROR, "SpeedUnknown", "no TPOT from the engines' metrics")
    regression = candidate_tpot_s / control_tpot_s - 1.0
    tpots = f"TPOT {candidate_tpot_s * 1000:.1f} ms vs {control_tpot_s * 1000:.1f} ms"
    if clocks is not None and clocks.control is not None and clocks.candidate is not None:
        mismatch = compare_clocks(clocks.control, clocks.candidate, gate.max_clock_difference)
        if mismatch is not None:
            return GateResult(
                SPEED,
                Outcome.INCONCLUSIVE,
                "ClocksDiffer",
                f"no speed claim: the arms ran at different GPU clocks: {mismatch}; "
                f"{tpots} not compared",
            )
        sm = clocks.candidate.sm or clocks.candidate.mem
        where = f" at matched GPU clocks ({sm.mean:,.0f} MHz)" if sm is not None else ""
    elif clocks is not None:
        where = f" (GPU clocks not compared: {clocks.note or 'an arm has no DCGM series'})"
    else:
        where = ""
    detail = f"{tpots} ({regression:+.0%}, limit +{gate.max_tpot_regression:.0%}){where}"
    if regression > gate.max_tpot_regression:
        return GateResult(SPEED, Outcome.FAILED, "SpeedRegressed", detail)
    return GateResult(SPEED, Outcome.SUCCESSFUL, "SpeedWithinLimit", detail)


# --- decision ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    outcome: Outcome
    reasons: tuple[GateResult, ...]  # the gates that decided, worst first
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision.value,
            "outcome": self.outcome.value,
            "reasons": [r.reason for r in self.reasons],
            "message": self.message,
        }


def decide(
    results: Sequence[GateResult],
    *,
    mode: PromotionMode,
    config_hash: str,
    approval: str | None,
) -> Verdict:
    """Promote, roll back, hold or not-needed from every gate result; fail closed.

    Any blocking outcome rolls back and every blocking reason is listed. PENDING holds. A pass
    in manual mode holds until the approval annotation equals `config_hash`, so an approval
    given for another candidate never promotes this one.
    """
    if not results:
        return Verdict(Decision.HOLD, Outcome.PENDING, (), "no evidence yet")
    overall = worst(r.outcome for r in results)
    ranked = sorted(results, key=lambda r: list(Outcome).index(r.outcome), reverse=True)
    if overall.blocks:
        blocking = tuple(r for r in ranked if r.outcome.blocks)
        return Verdict(
            Decision.ROLL_BACK, overall, blocking, "; ".join(r.message for r in blocking)
        )
    if overall is Outcome.NOT_NEEDED:
        why = tuple(r for r in ranked if r.outcome is Outcome.NOT_NEEDED)
        return Verdict(Decision.NOT_NEEDED, overall, why, "; ".join(r.message for r in why))
    if overall is Outcome.PENDING:
        waiting = tuple(r for r in ranked if r.outcome is Outcome.PENDING)
        return Verdict(Decision.HOLD, overall, waiting, "; ".join(r.message for r in waiting))
    warnings = tuple(r for r in ranked if r.outcome is Outcome.WARNING)
    note = f" (warnings: {'; '.join(r.message for r in warnings)})" if warnings else ""
    if mode is PromotionMode.MANUAL and approval != config_hash:
        stale = f"; approval {approval!r} is for another config" if approval else ""
        return Verdict(
            Decision.HOLD,
            overall,
            warnings,
            f"all gates passed; approve with annotation kvgate.io/approve={config_hash}{stale}{note}",
        )
    return Verdict(Decision.PROMOTE, overall, warnings, f"all gates passed{note}")


# --- pods -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodHealth:
    exists: bool
    ready: bool = False
    crashed: bool = False
    detail: str = ""
    restarts: int = 0
    ip: str | None = None


_CRASH_WAITING: Final = frozenset(
    {
        "CrashLoopBackOff",
        "Error",
        "RunContainerError",
        "CreateContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
    }
)


def pod_health(pod: Mapping[str, Any] | None, container: str | None = None) -> PodHealth:
    """Ready, crashed or starting, from a Pod object (dict form of the API object)."""
    if pod is None:
        return PodHealth(exists=False, detail="pod does not exist")
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    cs = next((s for s in statuses if container is None or s.get("name") == container), None)
    ip = status.get("podIP")
    if status.get("phase") == "Failed":
        return PodHealth(True, crashed=True, detail=_terminated_detail(cs, status), ip=ip)
    if status.get("phase") == "Succeeded":
        return PodHealth(True, crashed=True, detail="engine exited (pod Succeeded)", ip=ip)
    if cs is None:
        return PodHealth(True, detail=f"pod {status.get('phase', 'Pending')}", ip=ip)
    restarts = int(cs.get("restartCount") or 0)
    state = cs.get("state") or {}
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in _CRASH_WAITING:
        detail = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
        return PodHealth(True, crashed=True, detail=detail, restarts=restarts, ip=ip)
    if "terminated" in state:
        return PodHealth(True, crashed=True, detail=_terminated_detail(cs, status), ip=ip)
    if restarts > 0:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        detail = f"restarted {restarts}x (last exit {last.get('exitCode', '?')})"
        return PodHealth(True, crashed=True, detail=detail, restarts=restarts, ip=ip)
    ready = bool(cs.get("ready")) and status.get("phase") == "Running"
    return PodHealth(True, ready=ready, detail="ready" if ready else "starting", ip=ip)


def _terminated_detail(cs: Mapping[str, Any] | None, status: Mapping[str, Any]) -> str:
    term = ((cs or {}).get("state") or {}).get("terminated") or {}
    if term:
        return f"exited with code {term.get('exitCode', '?')} ({term.get('reason', 'Error')})"
    return f"pod {status.get('phase')}: {status.get('reason') or status.get('message') or 'failed'}"


def crash_summary(scan: Mapping[str, Any] | None, fallback: str) -> tuple[str, str | None]:
    """(what failed, remedy) from a crashed arm's log scan: the first error finding and its hint."""
    errors = [
        f
        for f in (scan or {}).get("findings") or []
        if str(f.get("severity", "")).lower() in ("error", "fatal", "critical")
    ]
    # "engine failed to start" only points at its cause; the cause carries the remedy.
    errors.sort(key=lambda f: f.get("code") in _GENERIC_FAILURES)
    for f in errors:
        return str(f.get("text") or f.get("code") or fallback), f.get("hint") or None
    tail = (scan or {}).get("tail") or []
    if tail:  # a cause the scanner does not know: the last line says most
        return f"{fallback}; last log line: {str(tail[-1])[:300]}", None
    return fallback, None


@dataclass(frozen=True, slots=True)
class Remedy:
    """The documented remedy for a candidate's crash signature, valid for its engine version.

    From `kvgate.engine_versions.remedy_for`; `refused` says why the operator's allowlist does
    not let kvgate apply it (empty: allowed).
    """

    code: str  # the finding it answers: attention-build-failed or fp8-unsupported
    engine: str
    version: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    refused: str = ""

    @property
    def text(self) -> str:
        parts = [" ".join(self.args)] if self.args else []
        parts.extend(f"{k}={v}" for k, v in self.env.items())
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "engine": self.engine,
            "engineVersion": self.version,
            "args": list(self.args),
            "env": dict(self.env),
        }


def find_remedy(
    scan: Mapping[str, Any] | None,
    engine: str | None,
    image_version: str | None,
    allowlist: Any = None,
) -> Remedy | None:
    """The remedy for the first remediable error finding of a crashed candidate's scan.

    The version is the one the engine logged (what it runs), else the image tag's; without
    either there is none (the flag or variable that picks a backend depends on the version).
    `allowlist` (a `kvgate.policy.Allowlist`) decides whether kvgate may apply it.
    """
    from kvgate import engine_versions, policy

    if not scan or not engine:
        return None
    version = scan.get("engine_version") or image_version
    codes = [
        str(f.get("code"))
        for f in scan.get("findings") or []
        if str(f.get("severity", "")).lower() == "error"
    ]
    code = next((c for c in codes if c in engine_versions.REMEDIABLE_CODES), None)
    if code is None or not isinstance(version, str):
        return None
    try:
        found = engine_versions.remedy_for(engine, version, code)
    except ValueError:
        return None
    if found is None:
        return None
    args, env = found
    allow = allowlist if allowlist is not None else policy.BUILTIN
    refused = [v.message for v in policy.check_args(list(args), engine, allow)]
    refused += [f"{n} is not an allowed variable" for n in env if not allow.env_allowed(engine, n)]
    return Remedy(code, engine, version, tuple(args), dict(env), "; ".join(refused))


# --- the transition function ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True, slots=True)
class State:
    """What the status says: the phase, how long it has lasted, the gates so far."""

    phase: Phase
    phase_elapsed_s: float = 0.0
    config_hash: str = ""
    eval_attempts: int = 0
    gates: Mapping[str, GateResult] = field(default_factory=dict)
    approval: str | None = None  # the config hash an approval that counts names
    approver: str = ""  # who gave it (recorded by the approval policy), for status and Events
    approval_ignored: str = ""  # why an approval annotation present does not count
    abort: str | None = None  # kvgate.io/abort is set: who set it and why, one line
    # Promoting / Verifying / Reverting: what status says kvgate did
    patched: bool = False  # the candidate patch was applied (or found applied) by kvgate
    verify_samples: int = 0  # passing verify samples in the current window
    since_last_sample_s: float | None = None
    window_elapsed_s: float = 0.0
    revert: RevertIntent | None = None
    revert_attempts: int = 0
    revert_error: str | None = None
    remedy_attempts: int = 0  # candidates started again with a remedy (at most one)


@dataclass(frozen=True, slots=True)
class RevertIntent:
    """Recorded before a revert starts: the terminal phase, reason and message it ends with."""

    phase: Phase
    reason: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"phase": self.phase.value, "reason": self.reason, "message": self.message}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RevertIntent:
        try:
            phase = Phase(data.get("phase", Phase.ROLLED_BACK.value))
        except ValueError:
            phase = Phase.ROLLED_BACK
        if not phase.terminal or phase is Phase.PROMOTED:
            phase = Phase.ROLLED_BACK  # a revert never ends Promoted
        return cls(
            phase, str(data.get("reason") or "PromotionReverted"), str(data.get("message") or "")
        )


@dataclass(frozen=True, slots=True)
class LiveTarget:
    """The production Deployment as read now, against what kvgate evaluated and changes."""

    exists: bool
    container_found: bool = True
    as_evaluated: bool = False  # image, command, args and env equal the evaluated container
    differences: tuple[str, ...] = ()  # guarded fields that differ from the evaluated ones
    carries_candidate: bool = False  # every edit kvgate makes is there
    ours_present: bool = False  # at least one edit kvgate makes is there


@dataclass(frozen=True, slots=True)
class Observation:
    """What the handler saw this time; only the fields of the current phase are filled."""

    spec_errors: tuple[str, ...] = ()
    target_problem: str | None = None  # Pending: why the Deployment/container/engine is unusable
    target_missing: bool = False
    conflicts: tuple[str, ...] = ()
    dtype_problem: str | None = None
    # Preflight
    pool_samples: int = 0
    pool_pressured: bool | None = None
    pool_detail: str = ""
    checkpoint_has_scales: bool | None = None
    control_forced_fp8: str | None = None  # why the checkpoint makes an `auto` control run FP8
    # Canary
    control: PodHealth | None = None
    candidate: PodHealth | None = None
    control_scan: Mapping[str, Any] | None = None
    candidate_scan: Mapping[str, Any] | None = None
    # Canary: each arm's `metrics.cache_truth`, once its /metrics was read (None: not yet)
    control_metrics: Mapping[str, Any] | None = None
    candidate_metrics: Mapping[str, Any] | None = None
    metrics_error: str | None = None  # the last failed scrape of an arm's /metrics
    remedy: Remedy | None = None  # Canary: the remedy for the candidate's crash, if known
    # Evaluating
    job_exists: bool = False
    job_finished: bool = False
    eval_summary: Mapping[str, Any] | None = None
    eval_error: str | None = None
    control_tpot_s: float | None = None
    candidate_tpot_s: float | None = None
    speed_clocks: SpeedClocks | None = None  # None: no Prometheus to ask
    # Promoting / Verifying
    rollout_done: bool = False
    rollout_crashed: str | None = None
    rollout_scan: Mapping[str, Any] | None = None
    production_problem: str | None = None
    sampled: bool = False  # Verifying: a verify sample was taken now
    # Every phase after Pending: the live target
    live: LiveTarget | None = None


@dataclass(frozen=True, slots=True)
class Step:
    phase: Phase
    reason: str
    message: str
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    gates: tuple[GateResult, ...] = ()
    requeue_s: float | None = None
    verdict: Verdict | None = None
    eval_attempts: int | None = None
    revert: RevertIntent | None = None  # set on the step that enters Reverting
    patched: bool | None = None  # True: record that the candidate patch is on the Deployment
    verify_samples: int | None = None  # Verifying: passing samples so far in this window
    restart_window: bool = False  # Verifying: the window starts over at this sample
    remedy: Remedy | None = None  # Canary: record it, then start the candidate again with it

    @property
    def terminal(self) -> bool:
        return self.phase.terminal


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """The approval annotations of a rollout (see `model.ANNOTATION_*`)."""

    approve: str | None = None  # kvgate.io/approve: the config hash approved
    created_by: str | None = None
    approved_by: str | None = None
    approved_generation: str | None = None
    abort: str | None = None
    aborted_by: str | None = None


def read_approval(
    record: ApprovalRecord, generation: int | None, *, require_identity: bool
) -> tuple[str | None, str, str]:
    """(the approved hash if the approval counts, the approver, why it does not count).

    The chart's admission policies record the approver and the generation an approval was
    given at, and refuse the author's own approval; this is the operator's second wall. An
    approval counts only for the generation (the run) it was given for, never when the
    recorded approver is the recorded author, and, with `require_identity` (the policy is
    installed), only with both recorded.
    """
    if not record.approve:
        return None, "", ""
    by = record.approved_by or ""
    if by and record.created_by and by == record.created_by:
        return None, by, f"approval by {by} ignored: {by} created this rollout"
    if require_identity and not (by and record.created_by and record.approved_generation):
        return (
            None,
            by,
            (
                "approval ignored: it carries no approver or author recorded by the apiserver "
                "(kvgate.io/approved-by, kvgate.io/created-by); re-approve with the approval "
                "policy installed"
            ),
        )
    given = record.approved_generation
    if given is not None and given != str(generation):
        return (
            None,
            by,
            (
                f"approval ignored: it was given for generation {given}, the spec is now "
                f"generation {generation}; approve again"
            ),
        )
    return record.approve, by, ""


def abort_text(record: ApprovalRecord) -> str | None:
    """One line saying who aborted and why, from kvgate.io/abort; None when not set."""
    if not record.abort:
        return None
    why = " ".join(record.abort.split())[:200]
    who = f" by {record.aborted_by}" if record.aborted_by else ""
    return f"aborted{who} (kvgate.io/abort: {why})"


def _delay(seconds: float) -> float:
    return min(max(seconds, MIN_DELAY_S), MAX_DELAY_S)


def _end(phase: Phase, reason: str, message: str, **kw: Any) -> Step:
    """A terminal step; canaries and the eval Job are no longer needed."""
    actions = (*kw.pop("actions", ()), Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB)
    bad = phase in (Phase.ROLLED_BACK, Phase.FAILED)
    events = list(kw.pop("events", ()))
    # The specific reason (alert on CanaryCrashed), then the outcome (alert on any RolledBack).
    for r in (reason, _OUTCOME_EVENTS[phase]):
        if all(e.reason != r for e in events):
            events.append(Event(r, message, warning=bad))
    return Step(phase, reason, message, actions=actions, events=tuple(events), **kw)


_OUTCOME_EVENTS: Final = {
    Phase.PROMOTED: "Promoted",
    Phase.ROLLED_BACK: "RolledBack",
    Phase.NOT_NEEDED: "NotNeeded",
    Phase.FAILED: "RolloutFailed",
}


def _event_for(result: GateResult) -> Event | None:
    """Gate results worth an Event of their own (alerting matches the reason)."""
    if result.reason in (
        "ScalesMissing", "ScalesDropped", "BackendChanged", "BackendNotAllowed", "DivergenceFlagged"
    ):  # fmt: skip
        return Event(result.reason, result.message, warning=True)
    return None


REVERT_BACKOFF_MAX_S: Final = 60.0  # production may be crashing meanwhile: retry every minute


def phase_deadline(spec: RolloutSpec, phase: Phase) -> float | None:
    """How long a phase may last, even while observation keeps failing (None: no limit)."""
    c, p, cap = spec.canary, spec.promotion, spec.capacity
    deadlines = {
        Phase.PENDING: c.startup_timeout_s,
        Phase.PREFLIGHT: cap.sampling_deadline_s + c.startup_timeout_s,
        Phase.CANARY: c.startup_timeout_s,
        Phase.EVALUATING: c.eval_timeout_s * (c.eval_retries + 1) + EVAL_GRACE_S,
        Phase.PROMOTING: c.startup_timeout_s,
        Phase.VERIFYING: p.verify_window_s * 3 + c.startup_timeout_s,
    }
    return deadlines.get(phase)


def revert_backoff(attempts: int) -> float:
    """Seconds before the next revert attempt: 5, 10, 20, 40, then every minute."""
    return float(min(5.0 * 2.0 ** max(attempts - 1, 0), REVERT_BACKOFF_MAX_S))


def revert_retry_due_s(attempts: int) -> float:
    """When, in seconds after Reverting began, the attempt after `attempts` refused ones is due.

    Counted from the phase's start (status has no per-attempt clock the core sees); after an
    operator outage the overdue attempts come one per read-back until the schedule is met.
    """
    return sum(revert_backoff(a) for a in range(1, attempts + 1))


def give_up(spec: RolloutSpec, state: State, error: str, errors: int, *, limit: int) -> Step | None:
    """After `limit` consecutive errors, or past the phase's deadline, the rollout ends.

    None: retry. A patched phase does not end: it goes to Reverting, whose end needs a read
    back. Reverting itself never ends here (sticky): it reports RevertFailed and keeps trying.
    Before Promoting kvgate has changed nothing on the Deployment (the patch is only made in
    Promoting, after its intent is recorded), so there the end is Failed.
    """
    deadline = phase_deadline(spec, state.phase)
    late = deadline is not None and state.phase_elapsed_s >= deadline
    if state.phase.terminal or (errors <= limit and not late):
        return None
    why = (
        f"gave up after {errors} consecutive errors (limit {limit})"
        if errors > limit
        else f"phase {state.phase.value} passed its deadline of {deadline:g}s"
    )
    message = f"{why}; last: {error}"
    if state.phase is Phase.REVERTING:
        retry_s = revert_backoff(state.revert_attempts + 1)
        return Step(
            Phase.REVERTING,
            "RevertFailed",
            f"revert not confirmed: {message}; next try in {retry_s:g}s",
            events=(Event("RevertFailed", message, warning=True),),
            revert=state.revert,
            requeue_s=retry_s,
        )
    if state.phase in PATCHED_PHASES:
        return _revert(Phase.ROLLED_BACK, "PromotionReverted", message)
    return _end(Phase.FAILED, "ExternalErrors", message)


def _revert(phase: Phase, reason: str, message: str, **kw: Any) -> Step:
    """Enter Reverting: the end (phase, reason, message) is recorded first; the revert patch is
    made on the next reconcile, after this status write succeeded."""
    intent = RevertIntent(phase, reason, message)
    return Step(
        Phase.REVERTING,
        "Reverting",
        f"reverting the Deployment: {message}",
        actions=(Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB),
        events=tuple(kw.pop("events", ())),
        revert=intent,
        requeue_s=MIN_DELAY_S,
        **kw,
    )


def next_step(
    spec: RolloutSpec,
    state: State,
    obs: Observation,
    *,
    poll_s: float,
    approval_ttl_s: float | None = None,
) -> Step:
    """The one transition function: (spec, state, observation) -> next step.

    Whatever the phase decided, an end other than Promoted is only reached when the live
    Deployment carries none of kvgate's edits; otherwise the rollout reverts first. An abort
    (`state.abort`) ends any running phase that way; an approval that has not come within
    `approval_ttl_s` of the verdict never comes (the evidence is stale).
    """
    handler = _PHASES.get(state.phase)
    if handler is None:  # terminal: nothing moves
        return Step(state.phase, "Terminal", f"rollout is {state.phase.value}")
    live = obs.live
    if (
        live is not None
        and live.ours_present
        and state.phase in (Phase.PREFLIGHT, Phase.CANARY, Phase.EVALUATING)
    ):
        # kvgate patches only in Promoting: a candidate on the Deployment now was put there by a
        # crashed run or by hand, and nothing here says it should stay.
        return _revert(
            Phase.ROLLED_BACK,
            "UnexpectedPatch",
            f"the Deployment carries the candidate config while the rollout is "
            f"{state.phase.value} (not promoted); reverting it",
        )
    if state.abort is not None and state.phase is not Phase.REVERTING:
        step = _end(Phase.ROLLED_BACK, "Aborted", state.abort)
    elif (
        state.phase is Phase.AWAITING_APPROVAL
        and approval_ttl_s is not None
        and state.phase_elapsed_s >= approval_ttl_s
    ):
        step = _end(
            Phase.ROLLED_BACK,
            "ApprovalExpired",
            f"no approval within {approval_ttl_s:g}s of the verdict: the evidence is stale; "
            "change the spec (or re-create the rollout) to evaluate again",
        )
    else:
        step = handler(spec, state, obs, poll_s)
    if (
        step.terminal
        and step.phase is not Phase.PROMOTED
        and live is not None
        and live.exists
        and live.ours_present
    ):
        return _revert(step.phase, step.reason, step.message, gates=step.gates,
                       verdict=step.verdict)  # fmt: skip
    return step


def _pending(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    if obs.spec_errors:
        return _end(Phase.FAILED, "InvalidSpec", "; ".join(obs.spec_errors))
    if obs.target_missing:
        if state.phase_elapsed_s >= spec.canary.startup_timeout_s:
            return _end(
                Phase.FAILED,
                "TargetNotFound",
                f"Deployment {spec.target.name} not found within "
                f"{spec.canary.startup_timeout_s:g}s; create it, then the rollout",
            )
        return Step(
            Phase.PENDING,
            "WaitingForTarget",
            f"waiting for Deployment {spec.target.name}",
            requeue_s=_delay(poll_s),
        )
    if obs.target_problem:
        return _end(Phase.FAILED, "InvalidTarget", obs.target_problem)
    if obs.dtype_problem:
        return _end(Phase.FAILED, "InvalidSpec", obs.dtype_problem)
    if obs.conflicts:
        return _end(
            Phase.FAILED,
            "RolloutConflict",
            f"Deployment {spec.target.name} already has an active rollout: "
            f"{', '.join(obs.conflicts)}; wait for it or delete it",
        )
    return Step(
        Phase.PREFLIGHT,
        "Preflight",
        f"checking whether the KV pool of {spec.target.name} is the limit",
        requeue_s=MIN_DELAY_S,
    )


def control_runs_fp8(reasons: Sequence[str], production_dtype: str, target: str) -> str | None:
    """Why the control arm would run FP8 (the checkpoint forces it under `auto`); None when it
    does not: no such checkpoint, or production pins a dtype (an explicit dtype wins)."""
    if not reasons or production_dtype != "auto":
        return None
    return (
        f"the checkpoint forces an FP8 KV cache under --kv-cache-dtype auto ({'; '.join(reasons)})"
        f" and {target} runs auto: production and the control run FP8 already, so "
        "the canary would compare FP8 with FP8; pin the dtype (--kv-cache-dtype bfloat16) first"
    )


def _preflight(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    if obs.control_forced_fp8:  # no BF16 arm to compare with: fail closed before any canary
        return _end(Phase.FAILED, "ControlRunsFP8", obs.control_forced_fp8)
    gate = spec.capacity
    sampling = obs.pool_samples < gate.samples and state.phase_elapsed_s < gate.sampling_deadline_s
    if gate.mode is not GateMode.OFF and obs.pool_pressured is None and sampling:
        return Step(
            Phase.PREFLIGHT,
            "SamplingPool",
            f"sampling pool pressure {obs.pool_samples}/{gate.samples}",
            requeue_s=_delay(gate.interval_s),
        )
    pool = assess_pool(gate, obs.pool_pressured, obs.pool_detail or "no samples")
    gates = [pool]
    events: list[Event] = []
    if pool.outcome is Outcome.NOT_NEEDED:
        return _end(Phase.NOT_NEEDED, "PoolHasRoom", pool.message, gates=tuple(gates))
    if pool.outcome.blocks:
        return _end(Phase.FAILED, pool.reason, pool.message, gates=tuple(gates))
    if pool.outcome is Outcome.WARNING:
        events.append(Event(pool.reason, pool.message, warning=pool.reason != "PoolHasRoom"))
    return Step(
        Phase.CANARY,
        "CanaryStarting",
        "starting the control and candidate pods",
        actions=(Action.CREATE_CANARIES,),
        events=tuple(events),
        gates=tuple(gates),
        requeue_s=_delay(poll_s),
    )


def _canary(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    control = obs.control or PodHealth(False)
    candidate = obs.candidate or PodHealth(False)
    for arm, health, scan in (
        ("candidate", candidate, obs.candidate_scan),
        ("control", control, obs.control_scan),
    ):
        if health.crashed:
            what, remedy = crash_summary(scan, health.detail)
            message = f"{arm} pod crashed: {what}"
            fix = obs.remedy if arm == "candidate" else None
            if fix is not None:
                step = _remediate(spec, state, fix, message)
                if step is not None:
                    return step
                message += f"; remedy for {fix.engine} {fix.version}: {fix.text}"
                if spec.canary.remediation is Remediation.AUTO and fix.refused:
                    message += f" (not applied, the allowlist refuses it: {fix.refused})"
            elif remedy:
                message += f"; remedy: {remedy}"
            if arm == "candidate" and state.remedy_attempts:
                message += " (already applied: the remedied candidate crashed too)"
            gate = GateResult(CANARY, Outcome.FAILED, "CanaryCrashed", message)
            return _end(
                Phase.ROLLED_BACK,
                "CanaryCrashed",
                message,
                gates=(gate,),
                events=(Event("CanaryCrashed", message, warning=True),),
            )
    if not (control.ready and candidate.ready):
        if state.phase_elapsed_s >= spec.canary.startup_timeout_s:
            waiting = [
                a for a, h in (("control", control), ("candidate", candidate)) if not h.ready
            ]
            message = (
                f"{' and '.join(waiting)} not Ready within {spec.canary.startup_timeout_s:g}s "
                f"({candidate.detail if not candidate.ready else control.detail})"
            )
            gate = GateResult(CANARY, Outcome.ERROR, "CanaryTimeout", message)
            return _end(Phase.ROLLED_BACK, "CanaryTimeout", message, gates=(gate,))
        missing = not (control.exists and candidate.exists)
        return Step(
            Phase.CANARY,
            "WaitingForCanary",
            f"waiting for canary pods Ready ({int(state.phase_elapsed_s)}/"
            f"{int(spec.canary.startup_timeout_s)} s): control {control.detail}, "
            f"candidate {candidate.detail}",
            actions=(Action.CREATE_CANARIES,) if missing else (),
            requeue_s=_delay(poll_s),
        )
    if obs.control_scan is None or obs.candidate_scan is None:
        return Step(Phase.CANARY, "ReadingLogs", "reading startup logs", requeue_s=_delay(poll_s))
    if obs.control_metrics is None or obs.candidate_metrics is None:
        if state.phase_elapsed_s >= spec.canary.startup_timeout_s:
            message = (
                f"the arms' /metrics were not readable within {spec.canary.startup_timeout_s:g}s"
                f" ({obs.metrics_error or 'no scrape answered'}): the log cannot be checked"
            )
            gate = GateResult(ENGINE_TRUTH, Outcome.ERROR, "MetricsUnreadable", message)
            return _end(Phase.ROLLED_BACK, "MetricsUnreadable", message, gates=(gate,))
        why = f": {obs.metrics_error}" if obs.metrics_error else ""
        return Step(
            Phase.CANARY, "ReadingMetrics", f"reading the arms' /metrics{why}",
            requeue_s=_delay(poll_s),
        )  # fmt: skip
    healthy = assess_arms_dtype(spec.kv_cache_dtype, obs.control_scan, obs.candidate_scan)
    truth = assess_engine_truth(
        {"control": obs.control_scan, "candidate": obs.candidate_scan},
        {"control": obs.control_metrics, "candidate": obs.candidate_metrics},
    )
    gates = (
        healthy,
        truth,
        assess_scales(spec.scales, obs.checkpoint_has_scales, obs.candidate_scan),
        assess_backend(spec.backend, obs.control_scan, obs.candidate_scan),
        assess_capacity_gain(
            spec.capacity_gain, kv_tokens(obs.control_scan), kv_tokens(obs.candidate_scan)
        ),
    )
    events = tuple(e for e in (_event_for(g) for g in gates) if e is not None)
    early = decide(gates, mode=PromotionMode.AUTO, config_hash="", approval="")
    if early.decision is Decision.ROLL_BACK:
        reason = early.reasons[0].reason
        return _end(
            Phase.ROLLED_BACK, reason, early.message, gates=gates, events=events, verdict=early
        )
    return Step(
        Phase.EVALUATING,
        "Evaluating",
        f"running the paired {spec.accuracy.task} eval ({spec.accuracy.questions} questions)",
        actions=(Action.SNAPSHOT_SPEED, Action.CREATE_EVAL_JOB),
        events=events,
        gates=gates,
        requeue_s=_delay(poll_s),
        eval_attempts=1,
    )


def _remediate(spec: RolloutSpec, state: State, fix: Remedy, crashed: str) -> Step | None:
    """With `remediation: auto`, the first crash with a known remedy starts the candidate again.

    Write-ahead: this step records the remedy (status.remediation, the remedied candidate's
    fingerprint and config hash) and resets the startup clock; both canaries are deleted and
    created again on later reconciles, after this status write. None: roll back instead.
    """
    if spec.canary.remediation is not Remediation.AUTO or state.remedy_attempts or fix.refused:
        return None
    message = (
        f"{crashed}; starting the candidate again with the remedy for {fix.engine} "
        f"{fix.version}: {fix.text}"
    )
    return Step(
        Phase.CANARY,
        "Remediating",
        message,
        actions=(Action.REMEDIATE, Action.DELETE_CANARIES),
        events=(Event("CanaryCrashed", crashed, warning=True), Event("Remediating", message)),
        remedy=fix,
        requeue_s=MIN_DELAY_S,
    )


def _arm_lost(obs: Observation) -> str | None:
    for arm, health in (("control", obs.control), ("candidate", obs.candidate)):
        if health is not None and (health.crashed or not health.exists):
            return f"{arm} pod {'crashed' if health.crashed else 'disappeared'}: {health.detail}"
    return None


def _evaluating(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    lost = _arm_lost(obs)
    if lost is not None:
        gate = GateResult(CANARY, Outcome.FAILED, "CanaryCrashed", lost)
        return _end(Phase.ROLLED_BACK, "CanaryCrashed", lost, gates=(gate,))
    # evalTimeout bounds one attempt (the Job's activeDeadlineSeconds); the phase as a whole
    # only catches a Job that never runs (every attempt's time, plus a scheduling grace).
    budget = spec.canary.eval_timeout_s * (spec.canary.eval_retries + 1) + EVAL_GRACE_S
    error = obs.eval_error
    if obs.eval_summary is not None and obs.eval_summary.get("verdict") == "error":
        error = str(obs.eval_summary.get("error") or "eval reported an error")
    elif obs.eval_summary is not None and error is None:
        error = _task_error(spec, obs.eval_summary)
    stuck = error is None and state.phase_elapsed_s >= budget
    if stuck:
        error = f"eval did not finish within {budget:g}s ({state.eval_attempts} attempt(s))"
    if error is not None:
        # An eval that errors is not a failed eval: retry within the limit.
        if state.eval_attempts <= spec.canary.eval_retries and not stuck:
            attempt = state.eval_attempts + 1
            return Step(
                Phase.EVALUATING,
                "EvalRetry",
                f"eval attempt {state.eval_attempts} errored ({error}); starting attempt {attempt}",
                actions=(Action.CREATE_EVAL_JOB,),
                events=(Event("EvalError", error, warning=True),),
                requeue_s=_delay(poll_s),
                eval_attempts=attempt,
            )
        gate = GateResult(ACCURACY, Outcome.ERROR, "EvalError", error)
        message = f"eval failed {state.eval_attempts} time(s), last: {error}"
        return _end(Phase.ROLLED_BACK, "EvalError", message, gates=(gate,))
    if obs.eval_summary is None:
        return Step(
            Phase.EVALUATING,
            "Evaluating",
            f"eval attempt {state.eval_attempts} running",
            actions=() if obs.job_exists else (Action.CREATE_EVAL_JOB,),
            requeue_s=_delay(poll_s),
        )
    accuracy = assess_accuracy(spec.accuracy, obs.eval_summary)
    long_context = assess_long_context(spec.accuracy.long_context, obs.eval_summary)
    divergence = assess_divergence(spec.divergence, obs.eval_summary)
    speed = assess_speed(spec.speed, obs.control_tpot_s, obs.candidate_tpot_s, obs.speed_clocks)
    gates = (accuracy, long_context, divergence, speed)
    results = (*[g for g in state.gates.values() if g.gate not in EVAL_GATES], *gates)
    verdict = decide(
        results, mode=spec.promotion.mode, config_hash=state.config_hash, approval=state.approval
    )
    events = tuple(e for e in (_event_for(g) for g in gates) if e is not None)
    if verdict.decision is Decision.ROLL_BACK:
        return _end(
            Phase.ROLLED_BACK,
            verdict.reasons[0].reason,
            verdict.message,
            gates=gates,
            verdict=verdict,
            events=events,
        )
    step = _after_verdict(spec, state, verdict, gates)
    return replace(step, events=(*events, *step.events))


def _task_error(spec: RolloutSpec, summary: Mapping[str, Any]) -> str | None:
    """An asked-for task that ran and errored (a timeout on a long prompt...): retried like
    a GSM8K error. A missing block is not retried: the gate fails it closed."""
    lc = summary.get("long_context")
    lc = lc if isinstance(lc, Mapping) and spec.accuracy.long_context is not None else {}
    if lc.get("verdict") == "error":
        return f"long-context task: {lc.get('error') or 'error'}"
    dv = summary.get("divergence")
    dv = dv if isinstance(dv, Mapping) and spec.divergence.mode is GateMode.REQUIRE else {}
    if dv.get("verdict") == "error":
        return f"divergence screen: {dv.get('error') or 'error'}"
    return None


def _after_verdict(
    spec: RolloutSpec, state: State, verdict: Verdict, gates: tuple[GateResult, ...]
) -> Step:
    if spec.promotion.mode is PromotionMode.REPORT:
        message = (
            f"verdict: promote ({verdict.message}); report mode: the Deployment is not changed"
        )
        return Step(
            Phase.AWAITING_APPROVAL,
            "VerdictReported",
            message,
            actions=(Action.DELETE_CANARIES,),
            events=(Event("VerdictReported", message),),
            gates=gates,
            verdict=verdict,
        )
    if verdict.decision is Decision.HOLD:
        return Step(
            Phase.AWAITING_APPROVAL,
            "AwaitingApproval",
            verdict.message,
            actions=(Action.DELETE_CANARIES,),
            gates=gates,
            verdict=verdict,
            requeue_s=MAX_DELAY_S / 3,
        )
    # Write-ahead: this step only records the decision; the patch is made in Promoting, on
    # the next reconcile, after this status write succeeded.
    return Step(
        Phase.PROMOTING,
        "Promoting",
        f"promotion decided; patching Deployment {spec.target.name}",
        actions=(Action.DELETE_CANARIES,),
        gates=gates,
        verdict=verdict,
        requeue_s=MIN_DELAY_S,
    )


def _awaiting(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    if spec.promotion.mode is PromotionMode.REPORT:
        return Step(Phase.AWAITING_APPROVAL, "VerdictReported", "verdict reported")
    verdict = decide(
        tuple(state.gates.values()),
        mode=spec.promotion.mode,
        config_hash=state.config_hash,
        approval=state.approval,
    )
    if verdict.decision is Decision.PROMOTE:
        step = _after_verdict(spec, state, verdict, ())
        by = f" by {state.approver}" if state.approver else ""
        return replace(
            step, events=(Event("Approved", f"approved{by} for config {state.config_hash}"),)
        )
    if verdict.decision is Decision.ROLL_BACK:
        return _end(Phase.ROLLED_BACK, verdict.reasons[0].reason, verdict.message, verdict=verdict)
    message = verdict.message
    if state.approval_ignored:
        message = f"{message}; {state.approval_ignored}"
    return Step(Phase.AWAITING_APPROVAL, "AwaitingApproval", message, requeue_s=MAX_DELAY_S / 3)


def _promoting(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    live = obs.live or LiveTarget(exists=False)
    name = spec.target.name
    if not live.exists:
        return _end(Phase.FAILED, "TargetDeleted", f"Deployment {name} disappeared")
    if not state.patched:
        if live.carries_candidate:
            # The patch went through but its record did not (operator died in between).
            return Step(
                Phase.PROMOTING,
                "RollingOut",
                f"found the candidate on Deployment {name}; waiting for it to roll out",
                patched=True,
                requeue_s=MIN_DELAY_S,
            )
        if not live.as_evaluated:
            changed = ", ".join(live.differences) or "container"
            return _end(
                Phase.FAILED,
                "TargetChanged",
                f"Deployment {name} changed since it was evaluated ({changed}); not promoting "
                "evidence about another config: start a new rollout",
            )
        return Step(
            Phase.PROMOTING,
            "Patching",
            f"patching Deployment {name}",
            actions=(Action.PATCH_DEPLOYMENT,),
            requeue_s=MIN_DELAY_S,
        )
    if not live.carries_candidate:
        return _superseded(name)
    if obs.rollout_crashed:
        return _revert(
            Phase.ROLLED_BACK,
            "PromotionReverted",
            f"promotion reverted: new pods failed: {obs.rollout_crashed}",
        )
    if state.phase_elapsed_s >= spec.canary.startup_timeout_s:
        return _revert(
            Phase.ROLLED_BACK,
            "PromotionReverted",
            f"promotion reverted: Deployment not rolled out within {spec.canary.startup_timeout_s:g}s",
        )
    if not obs.rollout_done or obs.rollout_scan is None:
        return Step(
            Phase.PROMOTING,
            "RollingOut",
            f"waiting for Deployment {name} to roll out",
            requeue_s=_delay(poll_s),
        )
    problems = [
        g
        for g in (
            assess_backend(spec.backend, obs.control_scan, obs.rollout_scan)
            if obs.control_scan is not None
            else None,
        )
        if g is not None and g.outcome.blocks
    ]
    if obs.rollout_scan.get("failed"):
        what, _ = crash_summary(obs.rollout_scan, "startup log reports a failure")
        problems.append(GateResult(CANARY, Outcome.FAILED, "PromotionFailed", what))
    if problems:
        return _revert(
            Phase.ROLLED_BACK,
            "PromotionReverted",
            "promotion reverted: " + "; ".join(p.message for p in problems),
        )
    return Step(
        Phase.VERIFYING,
        "Verifying",
        f"new pods ready; verifying production with {spec.promotion.verify_samples} samples "
        f"over {spec.promotion.verify_window_s:g}s",
        verify_samples=0,
        restart_window=True,
        requeue_s=MIN_DELAY_S,
    )


def _superseded(name: str) -> Step:
    return _end(
        Phase.FAILED,
        "Superseded",
        f"Deployment {name} no longer carries the candidate (reverted or edited by someone "
        "else): an external abort; kvgate does not re-apply it",
    )


def verify_due(spec: RolloutSpec, state: State) -> bool:
    """Whether a verify sample is due now (the handler scrapes only then)."""
    last = state.since_last_sample_s
    return last is None or last >= spec.promotion.verify_interval_s * 0.9


def _verifying(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    live = obs.live or LiveTarget(exists=False)
    name, p = spec.target.name, spec.promotion
    if not live.exists:
        return _end(Phase.FAILED, "TargetDeleted", f"Deployment {name} disappeared")
    if not live.carries_candidate:
        return _superseded(name)
    if obs.production_problem:
        return _revert(
            Phase.ROLLED_BACK,
            "PromotionReverted",
            f"promotion reverted during verification: {obs.production_problem}",
        )
    interval = p.verify_interval_s
    if not obs.sampled:
        left = interval - (state.since_last_sample_s or 0.0)
        return Step(
            Phase.VERIFYING,
            "Verifying",
            f"verifying production ({state.verify_samples}/{p.verify_samples} samples)",
            requeue_s=_delay(left),
        )
    gap = state.since_last_sample_s
    # An operator away for longer than two intervals saw nothing: the window starts over.
    restart = gap is not None and gap > 2 * max(interval, MIN_DELAY_S) + MIN_DELAY_S
    samples = 1 if restart else state.verify_samples + 1
    elapsed = 0.0 if restart else state.window_elapsed_s
    if samples >= p.verify_samples and elapsed >= p.verify_window_s:
        return _end(
            Phase.PROMOTED,
            "Promoted",
            f"Deployment {name} runs --kv-cache-dtype {spec.kv_cache_dtype}; verified by "
            f"{samples} samples over {elapsed:.0f}s",
            verify_samples=samples,
        )
    note = " (window restarted after a gap in observation)" if restart else ""
    return Step(
        Phase.VERIFYING,
        "Verifying",
        f"verifying production ({samples}/{p.verify_samples} samples){note}",
        verify_samples=samples,
        restart_window=restart,
        requeue_s=_delay(interval),
    )


def _reverting(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    intent = state.revert or RevertIntent(Phase.ROLLED_BACK, "PromotionReverted", "reverting")
    live = obs.live or LiveTarget(exists=False)
    name = spec.target.name
    if not live.exists:
        return _end(intent.phase, intent.reason, f"{intent.message} (Deployment {name} is gone)")
    if not live.ours_present:
        # Read back: none of kvgate's edits is left on the Deployment.
        events = (Event("PromotionReverted", f"Deployment {name} read back without kvgate's "
                        "change", warning=True),) if state.patched or state.revert_attempts else ()  # fmt: skip
        return _end(intent.phase, intent.reason, intent.message, events=events)
    if not live.container_found:
        message = f"cannot revert Deployment {name}: its container is gone or renamed"
        return Step(
            Phase.REVERTING,
            "RevertFailed",
            message,
            events=(Event("RevertFailed", message, warning=True),),
            requeue_s=revert_backoff(state.revert_attempts + 1),
        )
    if state.revert_attempts > 0:
        # An earlier attempt did not take (refused, or re-mutated): loud, sticky, retried. Every
        # attempt is read back on the next reconcile (seconds); the back-off spaces attempts.
        why = state.revert_error or "the Deployment still carries kvgate's change after the patch"
        wait_s = revert_retry_due_s(state.revert_attempts) - state.phase_elapsed_s
        message = (
            f"revert of Deployment {name} not confirmed after {state.revert_attempts} "
            f"attempt(s): {why}; "
            + (f"next try in {math.ceil(wait_s)}s" if wait_s > 0 else "trying again now")
        )
        return Step(
            Phase.REVERTING,
            "RevertFailed",
            message,
            actions=() if wait_s > 0 else (Action.REVERT_DEPLOYMENT,),
            events=() if wait_s > 0 else (Event("RevertFailed", message, warning=True),),
            requeue_s=wait_s if wait_s > 0 else MIN_DELAY_S,
        )
    return Step(
        Phase.REVERTING,
        "Reverting",
        f"reverting Deployment {name}: {intent.message}",
        actions=(Action.REVERT_DEPLOYMENT,),
        requeue_s=MIN_DELAY_S,
    )


_PHASES: Final = {
    Phase.PENDING: _pending,
    Phase.PREFLIGHT: _preflight,
    Phase.CANARY: _canary,
    Phase.EVALUATING: _evaluating,
    Phase.AWAITING_APPROVAL: _awaiting,
    Phase.PROMOTING: _promoting,
    Phase.VERIFYING: _verifying,
    Phase.REVERTING: _reverting,
}
