"""What does each piece of evidence say? The gates.

Every gate turns its evidence into a `GateResult` (an `Outcome`, an event reason and a message);
missing evidence is ERROR or PENDING and never promotes (fail closed). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Final

from kvgate.engines import kvformats
from kvgate.judge import crash
from kvgate.reasons import Reason
from kvgate.records.status import (
    CacheTruth,
    ClockRecord,
    ClocksRecord,
    GateResult,
    HistogramTotals,
    ScanRecord,
)
from kvgate.spec.rollout import (
    BackendGate,
    CapacityGainGate,
    CapacityGate,
    ScalesGate,
    SpeedGate,
)
from kvgate.vocabulary import (
    GateMode,
    Outcome,
    kv_dtype_family,
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
THROUGHPUT: Final = "throughputGain"
GATE_ORDER: Final = (
    POOL, SCALES, CANARY, ENGINE_TRUTH, BACKEND, CAPACITY_GAIN, ACCURACY, LONG_CONTEXT,
    DIVERGENCE, SPEED,
)  # fmt: skip
EVAL_GATES: Final = frozenset({ACCURACY, LONG_CONTEXT, DIVERGENCE, SPEED})


KV_SCALE_DEFAULT: Final = "kv-scale-default"  # evidence.logs: the engine fell back to scale 1.0
KV_SCALE_DROPPED: Final = "kv-scale-dropped"  # evidence.logs: SGLang's loader skipped the scales


def assess_pool(gate: CapacityGate, pressured: bool | None, detail: str) -> GateResult:
    """Is the KV pool the limit? Room plus `require` means the change is not needed."""
    result = partial(GateResult, POOL)
    require = gate.mode is GateMode.REQUIRE
    if gate.mode is GateMode.OFF:
        return result(Outcome.SKIPPED, Reason.GATE_OFF, "pool pressure not checked (mode off)")
    if pressured is True:
        return result(Outcome.SUCCESSFUL, Reason.POOL_PRESSURED, f"KV pool is the limit: {detail}")
    if pressured is False and require:
        room = f"KV pool has room: {detail}; an FP8 KV cache buys nothing here"
        return result(Outcome.NOT_NEEDED, Reason.POOL_HAS_ROOM, room)
    if pressured is False:
        return result(Outcome.WARNING, Reason.POOL_HAS_ROOM, f"KV pool has room: {detail}")
    if require:
        unknown = f"could not tell whether the KV pool is the limit: {detail}"
        return result(Outcome.ERROR, Reason.POOL_PRESSURE_UNKNOWN, unknown)
    return result(Outcome.WARNING, Reason.POOL_PRESSURE_UNKNOWN, f"pool pressure unknown: {detail}")


def scale_warnings(scan: ScanRecord | None, code: str = KV_SCALE_DEFAULT) -> list[str]:
    """Texts of one kind of KV-scale finding in a log scan (by default the 1.0 fallback)."""
    if scan is None:
        return []
    # Only k/v scales count: a missing q scale is printed even when k/v scales were loaded.
    return [str(f.text or f.code) for f in scan.findings if f.code == code]


def assess_scales(
    gate: ScalesGate,
    checkpoint_has_scales: bool | None,
    candidate_scan: ScanRecord | None,
    broken_scales: tuple[str, ...] = (),
    kv_cache_dtype: str = "fp8",
) -> GateResult:
    """KV scales: from the checkpoint scan and the candidate's startup log.

    A checkpoint with scales whose candidate still warns means the loader dropped them
    (ScalesDropped, louder than ScalesMissing). Scales that cannot scale (zero, negative, NaN,
    infinite) fail it in any mode but off when the candidate's format reads them.
    """
    result = partial(GateResult, SCALES)
    if gate.mode is GateMode.OFF:
        return result(Outcome.SKIPPED, Reason.GATE_OFF, "KV scales not checked (mode off)")
    if kvformats.computes_scales(kv_cache_dtype):  # nothing of the checkpoint's is read
        return result(Outcome.SUCCESSFUL, Reason.SCALES_UNUSED,
                      f"checkpoint scales unused: {kv_cache_dtype} computes a scale per (token, "
                      "head) as it writes the cache and sets the checkpoint's k/v scales"
                      f"{' (broken ones included)' if broken_scales else ''} to 1.0 (vLLM "
                      "kv_cache.py:98-108, 0.32); the accuracy gate decides")  # fmt: skip
    engine = candidate_scan.engine if candidate_scan is not None else None
    if broken_scales and kvformats.reads_checkpoint_scales(engine, kv_cache_dtype):
        more = (
            "; more in status.preflight.checkpoint.brokenScales" if len(broken_scales) > 3 else ""
        )
        return result(Outcome.FAILED, Reason.SCALES_BROKEN,
                      f"the checkpoint's k/v scales cannot scale ({'; '.join(broken_scales[:3])}"
                      f"{more}) and {kv_cache_dtype} reads them (real vLLM 0.32 loads such a "
                      "checkpoint silently and dies at its first request: 'k_scale must be "
                      "positive for FP8 path'); recalibrate the KV scales, or choose a "
                      "per-token-head format, which ignores them")  # fmt: skip
    warned = scale_warnings(candidate_scan)
    dropped = scale_warnings(candidate_scan, KV_SCALE_DROPPED)  # the loader's own words
    bad = Outcome.FAILED if gate.mode is GateMode.REQUIRE else Outcome.WARNING
    if checkpoint_has_scales is True and engine == "sglang" and not dropped:
        # SGLang prints its 1.0 warning without --quantization-param-path even when it loaded
        # the checkpoint's per-layer scales (sglang#31224): the checkpoint scan is the evidence.
        return result(Outcome.SUCCESSFUL, Reason.SCALES_PRESENT,
                      "checkpoint has k/v scales for every layer")  # fmt: skip
    if checkpoint_has_scales is True and (dropped or warned):
        return result(bad, Reason.SCALES_DROPPED,
                      f"checkpoint has KV scales but the candidate warns they were not used: "
                      f"{(dropped or warned)[0]}")  # fmt: skip
    if checkpoint_has_scales is False or warned:
        why = warned[0] if warned else "the checkpoint scan found no k/v scales"
        return result(bad, Reason.SCALES_MISSING, f"no KV scales: FP8 KV uses scale 1.0 ({why})")
    if candidate_scan is None:
        return result(Outcome.PENDING, Reason.SCALES_UNKNOWN, "waiting for the candidate log")
    if checkpoint_has_scales is True:
        return result(Outcome.SUCCESSFUL, Reason.SCALES_PRESENT,
                      "checkpoint has k/v scales for every layer; the candidate did not warn")  # fmt: skip
    # The checkpoint could not be read (offline, a gated model without a token) and the log is
    # silent: real vLLM 0.32 loads a checkpoint without scales without a word, so silence proves
    # nothing. Any doubt means no promotion in require mode.
    names = (
        "names no KV dtype" if not candidate_scan.kv_cache_dtype else "says nothing of KV scales"
    )
    return result(Outcome.INCONCLUSIVE if gate.mode is GateMode.REQUIRE else Outcome.WARNING,
                  Reason.SCALES_UNKNOWN,
                  f"the checkpoint could not be read and the candidate's startup log {names}: "
                  "nothing shows the k/v scales (an engine may load a checkpoint without them "
                  "silently); make the checkpoint readable to the operator (spec.model.name, "
                  "spec.model.tokenSecretRef for a gated model)")  # fmt: skip


def assess_backend(
    gate: BackendGate, control_scan: ScanRecord | None, candidate_scan: ScanRecord | None
) -> GateResult:
    """The candidate's attention backend: allowed, and whether it changed from the control's."""
    result = partial(GateResult, BACKEND)
    if control_scan is None or candidate_scan is None:
        return result(Outcome.PENDING, Reason.BACKEND_UNKNOWN, "waiting for both startup logs")
    control = control_scan.attention_backend or None
    candidate = candidate_scan.attention_backend or None
    if candidate is None:
        return result(
            Outcome.WARNING if not gate.allowed else Outcome.ERROR,
            Reason.BACKEND_UNKNOWN,
            "the candidate's startup log names no attention backend",
        )
    if gate.allowed and candidate not in gate.allowed:
        allowed = ", ".join(gate.allowed)
        message = f"candidate uses {candidate}, not one of {allowed}"
        return result(Outcome.FAILED, Reason.BACKEND_NOT_ALLOWED, message)
    if control is not None and control != candidate:
        message = (
            f"attention backend changed from {control} to {candidate}: "
            "two things changed at once (KV dtype and kernel)"
        )
        outcome = Outcome.WARNING if gate.allow_fallback else Outcome.FAILED
        return result(outcome, Reason.BACKEND_CHANGED, message)
    return result(Outcome.SUCCESSFUL, Reason.BACKEND_UNCHANGED, f"both arms use {candidate}")


def truth_facts(truth: CacheTruth | None) -> tuple[str | None, int | None]:
    """(KV dtype, KV tokens) an arm's own engine states: its /metrics `cache_config_info`, else
    SGLang's server info. The second source when the startup log does not say."""
    from kvgate.evidence import metrics

    if truth is None:
        return None, None
    snapshot = metrics.snapshot_from_cache_truth(truth)
    info = metrics.ServerInfo.from_status(truth.server_info)
    dtype = snapshot.kv_cache_dtype or (info.kv_cache_dtype if info else None)
    tokens = snapshot.kv_capacity_tokens or (info.max_total_num_tokens if info else None)
    return dtype, tokens


def assess_arms_dtype(
    wanted: str,
    control_scan: ScanRecord,
    candidate_scan: ScanRecord,
    candidate_truth: CacheTruth | None = None,
) -> GateResult:
    """Both arms Ready, and each runs the KV dtype it should: else the comparison is void.

    The candidate's dtype comes from its startup log, else its metrics or server info; when
    neither names it, kvgate does not assume FP8 (Inconclusive, which blocks promotion).
    """
    result = partial(GateResult, CANARY)
    control = control_scan.kv_cache_dtype or None
    candidate = candidate_scan.kv_cache_dtype or None
    source = "log"
    if not candidate:
        candidate, source = truth_facts(candidate_truth)[0], "/metrics"
    if not candidate:
        return result(
            Outcome.INCONCLUSIVE,
            Reason.CANDIDATE_DTYPE_UNREAD,
            "neither the candidate's startup log nor its /metrics (cache_config_info) or server "
            f"info name its KV cache dtype in a form kvgate reads: it cannot be shown to run {wanted}",
        )
    if kv_dtype_family(candidate) != kv_dtype_family(wanted):
        message = f"the candidate's {source} shows KV cache dtype {candidate}, not {wanted}"
        return result(Outcome.ERROR, Reason.CANDIDATE_DTYPE_MISMATCH, message)
    if control is not None and kv_dtype_family(control) == kv_dtype_family(wanted):
        message = f"the control already runs KV cache dtype {control}: nothing to compare"
        return result(Outcome.ERROR, Reason.CONTROL_DTYPE_MISMATCH, message)
    via = "" if source == "log" else " (read from its /metrics: its log does not say)"
    message = f"both arms Ready; candidate runs {candidate}{via}"
    return result(Outcome.SUCCESSFUL, Reason.CANARY_HEALTHY, message)


def assess_engine_truth(
    scans: Mapping[str, ScanRecord | None], truths: Mapping[str, CacheTruth | None]
) -> GateResult:
    """Each arm's startup log against its own /metrics (`metrics.cache_truth`); fail closed.

    SGLang's /metrics carry no KV dtype: its server info's `kv_cache_dtype` is checked instead.
    Any disagreement is an ERROR naming the arm and both values: the pod does not run what one
    source claims, so neither arm's evidence can be trusted. A candidate whose metrics give
    neither dtype nor capacity is a WARNING: the log stands alone.
    """
    from kvgate.evidence import crosscheck, metrics

    problems: list[str] = []
    compared: dict[str, list[str]] = {}
    read: dict[str, ScanRecord] = {}
    for arm in ("candidate", "control"):
        scan = read[arm] = scans.get(arm) or ScanRecord()
        truth = truths.get(arm) or CacheTruth()
        snapshot = metrics.snapshot_from_cache_truth(truth)
        problems.extend(f"{arm}: {f.text}" for f in crosscheck.cross_check_log(scan, snapshot))
        info = metrics.ServerInfo.from_status(truth.server_info)
        server_dtype = info.kv_cache_dtype if info else None
        server_tokens = info.max_total_num_tokens if info else None
        problems.extend(
            f"{arm}: {f.text}"
            for f in crosscheck.cross_check_server_info(scan, server_dtype, server_tokens)
        )
        what = compared.setdefault(arm, [])
        if scan.kv_cache_dtype and snapshot.kv_cache_dtype:
            what.append("KV dtype")
        if scan.kv_cache_dtype and server_dtype:
            what.append("KV dtype (server info)")
        if scan.kv_tokens and server_tokens:
            what.append("KV tokens (server info)")
        if scan.kv_tokens and snapshot.kv_capacity_tokens:
            what.append("KV tokens")
    result = partial(GateResult, ENGINE_TRUTH)
    if problems:
        disagree = "startup log and /metrics disagree: " + "; ".join(problems)
        return result(Outcome.ERROR, Reason.LOG_METRICS_DISAGREE, disagree)
    detail = "; ".join(f"{arm}: {', '.join(w) or 'nothing'}" for arm, w in compared.items())
    arm = "candidate"
    log_says = read[arm]
    if not compared[arm]:
        if not (log_says.kv_cache_dtype or log_says.kv_tokens) and any(
            truth_facts(truths.get(arm))
        ):
            return result(
                Outcome.WARNING,
                Reason.LOG_SILENT,
                "the candidate's startup log names no KV dtype or KV tokens in a form kvgate "
                "reads: its own /metrics are the only source",
            )
        return result(
            Outcome.WARNING,
            Reason.METRICS_SILENT,
            "the candidate's /metrics give no KV dtype or capacity to check its log against",
        )
    return result(
        Outcome.SUCCESSFUL, Reason.LOG_METRICS_AGREE, f"log and /metrics agree ({detail})"
    )


def kv_tokens(scan: ScanRecord | None, truth: CacheTruth | None = None) -> int | None:
    """KV tokens from a log scan's `capacity.kv_tokens`, else from the engine's own metrics."""
    value = scan.kv_tokens if scan is not None else None
    return value if value is not None else truth_facts(truth)[1]


def assess_capacity_gain(
    gate: CapacityGainGate, control_tokens: int | None, candidate_tokens: int | None
) -> GateResult:
    """Candidate KV tokens over control KV tokens against the minimum ratio."""
    result = partial(GateResult, CAPACITY_GAIN)
    if control_tokens is None or candidate_tokens is None:
        missing = "control" if control_tokens is None else "candidate"
        message = f"neither the {missing} startup log nor its /metrics give a KV cache size"
        return result(Outcome.ERROR, Reason.CAPACITY_UNKNOWN, message)
    ratio = candidate_tokens / control_tokens
    detail = f"{candidate_tokens:,} / {control_tokens:,} KV tokens = {ratio:.2f}x"
    if ratio < gate.min_ratio:
        below = f"{detail}, below the minimum {gate.min_ratio:g}x"
        return result(Outcome.FAILED, Reason.CAPACITY_NOT_GAINED, below)
    return result(Outcome.SUCCESSFUL, Reason.CAPACITY_GAINED, detail)


def mean_between(before: HistogramTotals | None, after: HistogramTotals | None) -> float | None:
    """Mean of a histogram over a window from its sum and count totals at both ends."""
    if before is None or after is None:
        return None
    ends = (before.sum, before.count, after.sum, after.count)
    if any(v is None for v in ends):
        return None
    count = float(after.count or 0) - float(before.count or 0)
    total = float(after.sum or 0) - float(before.sum or 0)
    return total / count if count > 0 and total >= 0 else None


_CLOCK_NAMES: Final = (("sm", "SM"), ("mem", "memory"))


def compare_clocks(control: ClockRecord, candidate: ClockRecord, tolerance: float) -> str | None:
    """Why the two arms' speeds cannot be compared (None: same clocks within `tolerance`).

    Window means are compared, and each arm's own range must stay within the tolerance too (a
    clock that throttled mid-window is not one clock)."""
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
    clocks: ClocksRecord | None = None,
) -> GateResult:
    """Candidate TPOT against control TPOT under the same load, at the same GPU clocks.

    Clocks that differ void the comparison (Inconclusive); unknown clocks (no DCGM in
    Prometheus) leave the claim standing and say so."""
    result = partial(GateResult, SPEED)
    if gate is None:
        return result(Outcome.SKIPPED, Reason.GATE_OFF, "speed not checked")
    if not control_tpot_s or candidate_tpot_s is None:
        return result(Outcome.ERROR, Reason.SPEED_UNKNOWN, "no TPOT from the engines' metrics")
    regression = candidate_tpot_s / control_tpot_s - 1.0
    tpots = f"TPOT {candidate_tpot_s * 1000:.1f} ms vs {control_tpot_s * 1000:.1f} ms"
    if clocks is not None and clocks.known and clocks.control and clocks.candidate:
        mismatch = compare_clocks(clocks.control, clocks.candidate, gate.max_clock_difference)
        if mismatch is not None:
            return result(
                Outcome.INCONCLUSIVE,
                Reason.CLOCKS_DIFFER,
                f"no speed claim: the arms ran at different GPU clocks: {mismatch}; "
                f"{tpots} not compared",
            )
        sm = clocks.candidate.sm or clocks.candidate.mem
        where = f" at matched GPU clocks ({sm.mean:,.0f} MHz)" if sm is not None else ""
    elif clocks is not None:
        where = f" (GPU clocks not compared: {(clocks.note or 'an arm has no DCGM series')[:300]})"
    else:
        where = ""
    detail = f"{tpots} ({regression:+.0%}, limit +{gate.max_tpot_regression:.0%}){where}"
    if regression > gate.max_tpot_regression:
        return result(Outcome.FAILED, Reason.SPEED_REGRESSED, detail)
    return result(Outcome.SUCCESSFUL, Reason.SPEED_WITHIN_LIMIT, detail)


def crash_summary(scan: ScanRecord | None, fallback: str) -> tuple[str, str | None]:
    """(what failed, remedy) from a crashed arm's log scan: the first error finding and its hint."""
    f = crash.root_cause(scan)
    if f is not None:
        return str(f.text or f.code or fallback), f.hint or None
    tail = scan.tail if scan is not None else ()
    if tail:  # a cause the scanner does not know: the last line says most
        return f"{fallback}; last log line: {tail[-1][:300]}", None
    return fallback, None
