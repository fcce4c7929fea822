"""What does each piece of evidence say? The gates.

Every gate turns its evidence into a `GateResult` (an `Outcome`, an event reason and a message);
missing evidence is ERROR or PENDING and never promotes (fail closed). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from kvgate import crash, kvformats
from kvgate.evalsummary import AccuracyStatus, DivergenceBucketRecord, LongContextBucketRecord
from kvgate.model import (
    CONTROL_BELOW_FLOOR,
    ArmClocks,
    GateMode,
    Outcome,
    SpeedClocks,
    kv_dtype_family,
)
from kvgate.reasons import Reason
from kvgate.spec import (
    AccuracyGate,
    BackendGate,
    CapacityGainGate,
    CapacityGate,
    DivergenceGate,
    LongContextTask,
    ScalesGate,
    SpeedGate,
)
from kvgate.status import CacheTruth, FindingRecord, HistogramTotals, ScanRecord
from kvgate.verdict import GateResult

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


KV_SCALE_DEFAULT: Final = "kv-scale-default"  # logs.py: the engine fell back to scale 1.0
KV_SCALE_DROPPED: Final = "kv-scale-dropped"  # logs.py: SGLang's loader skipped the scales


def assess_pool(gate: CapacityGate, pressured: bool | None, detail: str) -> GateResult:
    """Is the KV pool the limit? Room plus `require` means the change is not needed."""
    if gate.mode is GateMode.OFF:
        return GateResult(
            POOL, Outcome.SKIPPED, Reason.GATE_OFF, "pool pressure not checked (mode off)"
        )
    if pressured is True:
        return GateResult(
            POOL, Outcome.SUCCESSFUL, Reason.POOL_PRESSURED, f"KV pool is the limit: {detail}"
        )
    if pressured is False:
        if gate.mode is GateMode.REQUIRE:
            return GateResult(
                POOL,
                Outcome.NOT_NEEDED,
                Reason.POOL_HAS_ROOM,
                f"KV pool has room: {detail}; an FP8 KV cache buys nothing here",
            )
        return GateResult(
            POOL, Outcome.WARNING, Reason.POOL_HAS_ROOM, f"KV pool has room: {detail}"
        )
    if gate.mode is GateMode.REQUIRE:
        return GateResult(
            POOL,
            Outcome.ERROR,
            Reason.POOL_PRESSURE_UNKNOWN,
            f"could not tell whether the KV pool is the limit: {detail}",
        )
    return GateResult(
        POOL, Outcome.WARNING, Reason.POOL_PRESSURE_UNKNOWN, f"pool pressure unknown: {detail}"
    )


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

    A checkpoint with scales whose candidate still warns means the loader dropped them: that is
    ScalesDropped, a separate and louder finding than ScalesMissing. Scales that cannot scale
    (zero, negative, NaN, infinite: the checkpoint's values) fail it in any mode but off when
    the candidate's format reads them.
    """

    def result(outcome: Outcome, reason: Reason, message: str) -> GateResult:
        return GateResult(SCALES, outcome, reason, message)

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
    if control_scan is None or candidate_scan is None:
        return GateResult(
            BACKEND, Outcome.PENDING, Reason.BACKEND_UNKNOWN, "waiting for both startup logs"
        )
    control = control_scan.attention_backend or None
    candidate = candidate_scan.attention_backend or None
    if candidate is None:
        return GateResult(
            BACKEND,
            Outcome.WARNING if not gate.allowed else Outcome.ERROR,
            Reason.BACKEND_UNKNOWN,
            "the candidate's startup log names no attention backend",
        )
    if gate.allowed and candidate not in gate.allowed:
        return GateResult(
            BACKEND,
            Outcome.FAILED,
            Reason.BACKEND_NOT_ALLOWED,
            f"candidate uses {candidate}, not one of {', '.join(gate.allowed)}",
        )
    if control is not None and control != candidate:
        message = (
            f"attention backend changed from {control} to {candidate}: "
            "two things changed at once (KV dtype and kernel)"
        )
        outcome = Outcome.WARNING if gate.allow_fallback else Outcome.FAILED
        return GateResult(BACKEND, outcome, Reason.BACKEND_CHANGED, message)
    return GateResult(
        BACKEND, Outcome.SUCCESSFUL, Reason.BACKEND_UNCHANGED, f"both arms use {candidate}"
    )


def truth_facts(truth: CacheTruth | None) -> tuple[str | None, int | None]:
    """(KV dtype, KV tokens) an arm's own engine states: its /metrics `cache_config_info`, else
    SGLang's server info. The second source when the startup log does not say."""
    from kvgate import metrics

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

    The candidate's dtype comes from its startup log, else from its engine's own metrics or
    server info; when neither names it, kvgate cannot tell the candidate runs FP8 and does not
    assume it (Inconclusive, which blocks promotion).
    """
    control = control_scan.kv_cache_dtype or None
    candidate = candidate_scan.kv_cache_dtype or None
    source = "log"
    if not candidate:
        candidate, source = truth_facts(candidate_truth)[0], "/metrics"
    if not candidate:
        return GateResult(
            CANARY,
            Outcome.INCONCLUSIVE,
            Reason.CANDIDATE_DTYPE_UNREAD,
            "neither the candidate's startup log nor its /metrics (cache_config_info) or server "
            f"info name its KV cache dtype in a form kvgate reads: it cannot be shown to run {wanted}",
        )
    if kv_dtype_family(candidate) != kv_dtype_family(wanted):
        return GateResult(
            CANARY,
            Outcome.ERROR,
            Reason.CANDIDATE_DTYPE_MISMATCH,
            f"the candidate's {source} shows KV cache dtype {candidate}, not {wanted}",
        )
    if control is not None and kv_dtype_family(control) == kv_dtype_family(wanted):
        return GateResult(
            CANARY,
            Outcome.ERROR,
            Reason.CONTROL_DTYPE_MISMATCH,
            f"the control already runs KV cache dtype {control}: nothing to compare",
        )
    via = "" if source == "log" else " (read from its /metrics: its log does not say)"
    return GateResult(
        CANARY,
        Outcome.SUCCESSFUL,
        Reason.CANARY_HEALTHY,
        f"both arms Ready; candidate runs {candidate}{via}",
    )


def assess_engine_truth(
    scans: Mapping[str, ScanRecord | None], truths: Mapping[str, CacheTruth | None]
) -> GateResult:
    """Each arm's startup log against its own /metrics (`metrics.cache_truth`); fail closed.

    `scans` and `truths` are keyed by arm. SGLang's /metrics carry no KV dtype: its dtype is
    checked against its server info's `kv_cache_dtype` (`serverInfo` in the truth) instead.
    Any disagreement (KV dtype, KV tokens, GPU blocks)
    is an ERROR naming the arm and both values: the pod does not run what one source claims,
    so neither arm's evidence can be trusted. A candidate whose metrics give neither dtype
    nor capacity (an engine that exports no cache info) is a WARNING: the log stands alone.
    """
    from kvgate import crosscheck, logs, metrics

    problems: list[str] = []
    compared: dict[str, list[str]] = {}
    read: dict[str, logs.LogScan] = {}
    for arm in ("candidate", "control"):
        scan = read[arm] = logs.LogScan.of(scans.get(arm) or ScanRecord())
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
        if scan.capacity.kv_tokens and server_tokens:
            what.append("KV tokens (server info)")
        if scan.capacity.kv_tokens and snapshot.kv_capacity_tokens:
            what.append("KV tokens")
    if problems:
        return GateResult(
            ENGINE_TRUTH,
            Outcome.ERROR,
            Reason.LOG_METRICS_DISAGREE,
            "startup log and /metrics disagree: " + "; ".join(problems),
        )
    detail = "; ".join(f"{arm}: {', '.join(w) or 'nothing'}" for arm, w in compared.items())
    arm = "candidate"
    log_says = read[arm]
    if (
        not compared[arm]
        and not (log_says.kv_cache_dtype or log_says.capacity.kv_tokens)
        and any(truth_facts(truths.get(arm)))
    ):
        return GateResult(
            ENGINE_TRUTH,
            Outcome.WARNING,
            Reason.LOG_SILENT,
            "the candidate's startup log names no KV dtype or KV tokens in a form kvgate reads: "
            "its own /metrics are the only source",
        )
    if not compared[arm]:
        return GateResult(
            ENGINE_TRUTH,
            Outcome.WARNING,
            Reason.METRICS_SILENT,
            "the candidate's /metrics give no KV dtype or capacity to check its log against",
        )
    return GateResult(
        ENGINE_TRUTH,
        Outcome.SUCCESSFUL,
        Reason.LOG_METRICS_AGREE,
        f"log and /metrics agree ({detail})",
    )


def kv_tokens(scan: ScanRecord | None, truth: CacheTruth | None = None) -> int | None:
    """KV tokens from a log scan's `capacity.kv_tokens`, else from the engine's own metrics."""
    value = scan.kv_tokens if scan is not None else None
    return value if value is not None else truth_facts(truth)[1]


def assess_capacity_gain(
    gate: CapacityGainGate, control_tokens: int | None, candidate_tokens: int | None
) -> GateResult:
    """Candidate KV tokens over control KV tokens against the minimum ratio."""
    if control_tokens is None or candidate_tokens is None:
        missing = "control" if control_tokens is None else "candidate"
        return GateResult(
            CAPACITY_GAIN,
            Outcome.ERROR,
            Reason.CAPACITY_UNKNOWN,
            f"neither the {missing} startup log nor its /metrics give a KV cache size",
        )
    ratio = candidate_tokens / control_tokens
    detail = f"{candidate_tokens:,} / {control_tokens:,} KV tokens = {ratio:.2f}x"
    if ratio < gate.min_ratio:
        return GateResult(
            CAPACITY_GAIN,
            Outcome.FAILED,
            Reason.CAPACITY_NOT_GAINED,
            f"{detail}, below the minimum {gate.min_ratio:g}x",
        )
    return GateResult(CAPACITY_GAIN, Outcome.SUCCESSFUL, Reason.CAPACITY_GAINED, detail)


def assess_accuracy(gate: AccuracyGate, summary: AccuracyStatus | None) -> GateResult:
    """The eval summary's verdict (pass / fail / inconclusive / error) as an outcome."""
    if summary is None:
        return GateResult(
            ACCURACY, Outcome.PENDING, Reason.ACCURACY_PENDING, "accuracy not evaluated yet"
        )
    verdict = summary.verdict
    detail = accuracy_detail(summary)
    if verdict == "pass":
        return GateResult(ACCURACY, Outcome.SUCCESSFUL, Reason.ACCURACY_NON_INFERIOR, detail)
    if verdict == "fail":
        return GateResult(ACCURACY, Outcome.FAILED, Reason.ACCURACY_REGRESSED, detail)
    if verdict == "inconclusive" and summary.reason == CONTROL_BELOW_FLOOR:
        floor = summary.claim or "the control scored below the margin"
        return GateResult(ACCURACY, Outcome.INCONCLUSIVE, Reason.ACCURACY_INCONCLUSIVE, floor)
    if verdict == "inconclusive":
        needed = summary.advice.questions_needed if summary.advice is not None else None
        more = f"; about {needed} questions would decide" if needed else ""
        return GateResult(
            ACCURACY, Outcome.INCONCLUSIVE, Reason.ACCURACY_INCONCLUSIVE, detail + more
        )
    error = summary.error or f"eval summary verdict {verdict!r} is not pass/fail/inconclusive"
    return GateResult(ACCURACY, Outcome.ERROR, Reason.EVAL_ERROR, error)


def accuracy_detail(summary: AccuracyStatus) -> str:
    """The accuracy evidence in one line, with the one-sided bound the decision rests on.

    `control 91.0% vs candidate 90.5%, difference -0.5 pp; at least -1.9 pp (95% one-sided,
    adjusted for 4 looks) (margin 2 pp, n=200)`. A fail leads with what was shown: `candidate
    worse: 82.0% vs control 88.7%, difference -6.7 pp; shown worse by at least 0.3 pp (97.5%
    one-sided, adjusted for 3 looks) (margin 2 pp, n=300)`. Summaries without look-adjusted
    bounds (older eval images) show the two-sided interval, labelled as such.
    """
    c, k, paired = summary.control, summary.candidate, summary.paired
    if c is None or k is None or paired is None:
        return f"eval verdict {summary.verdict!r}"
    if c.accuracy is None or k.accuracy is None or paired.difference is None:
        return f"eval verdict {summary.verdict!r}"
    diff = paired.difference * 100
    margin = (summary.margin or 0) * 100
    control, candidate = c.accuracy * 100, k.accuracy * 100
    head = f"control {control:.1f}% vs candidate {candidate:.1f}%, difference {diff:+.1f} pp"
    tail = f"(margin {margin:g} pp, n={summary.questions_used})"
    bounds = summary.bounds
    if bounds is not None and bounds.lower is not None:
        adjusted = f", adjusted for {bounds.look} looks" if bounds.look_adjusted else ""
        if summary.verdict == "fail" and bounds.upper is not None:
            sure = (bounds.upper_confidence or 0.975) * 100
            return (
                f"candidate worse: {candidate:.1f}% vs control {control:.1f}%, difference "
                f"{diff:+.1f} pp; shown worse by at least {max(0.0, -bounds.upper) * 100:.1f}"
                f" pp ({sure:g}% one-sided{adjusted}) {tail}"
            )
        sure = (bounds.lower_confidence or 0.95) * 100
        text = f"{head}; at least {bounds.lower * 100:+.1f} pp ({sure:g}% one-sided{adjusted})"
        return f"{text} {tail}"
    interval = paired.tango95 or (float("nan"),) * 2
    if len(interval) != 2:
        return f"eval verdict {summary.verdict!r}"
    low, high = (x * 100 for x in interval)
    return f"{head} [{low:+.1f}, {high:+.1f}] (two-sided 95%) {tail}"


_LC_KIND: Final = "kvgate.eval/long_context"
_LC_VERDICTS: Final = {
    "fail": (Outcome.FAILED, Reason.LONG_CONTEXT_REGRESSED),
    "inconclusive": (Outcome.INCONCLUSIVE, Reason.LONG_CONTEXT_INCONCLUSIVE),
}


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def bucket_label(length: int) -> str:
    """A context-length bucket as a range: 32768 -> `16k-32k` (its prompts fill up to 32k)."""
    return f"{_tokens(length // 2)}-{_tokens(length)}"


def _bucket_figures(
    row: LongContextBucketRecord,
) -> tuple[float, int, float, float, int, float] | None:
    """(difference, context length, control and candidate accuracy, items, lower bound) of a
    long-context bucket; None when one is missing."""
    diff = row.paired.difference if row.paired else None
    ctl = row.control.accuracy if row.control else None
    cand = row.candidate.accuracy if row.candidate else None
    lower = row.bounds.lower if row.bounds else None
    length, items = row.context_length, row.items
    if diff is None or ctl is None or cand is None or lower is None or length is None:
        return None
    return None if items is None else (diff, length, ctl, cand, items, lower)


def assess_long_context(gate: LongContextTask | None, summary: AccuracyStatus) -> GateResult:
    """The eval summary's `long_context` block as the long-context task's outcome.

    Fail closed: when the task was asked for, a missing, malformed or self-contradicting block
    (a pass with a bucket that did not pass, other tasks than asked) is an ERROR, never a pass.
    A fail or inconclusive names the worst bucket: of those with the block's verdict, the one
    where the candidate lost most.
    """
    if gate is None:
        return GateResult(
            LONG_CONTEXT, Outcome.SKIPPED, Reason.GATE_OFF, "long context not evaluated"
        )
    block = summary.long_context

    def broken(why: str) -> GateResult:
        return GateResult(LONG_CONTEXT, Outcome.ERROR, Reason.LONG_CONTEXT_ERROR, why)

    if block is None or block.kind != _LC_KIND:
        return broken(
            "the eval summary has no long_context block, though spec.gates.accuracy.longContext "
            "asks for it (an eval image without the task?)"
        )
    verdict = block.verdict
    if verdict == "error" or verdict not in ("pass", "fail", "inconclusive"):
        return broken(f"long-context task: {block.error or f'verdict {verdict!r}'}")
    if list(block.tasks) != list(gate.tasks):
        return broken(f"long-context block ran tasks {list(block.tasks)!r}, not {list(gate.tasks)}")
    if gate.context_lengths and list(block.context_lengths) != list(gate.context_lengths):
        return broken(
            f"long-context block judged lengths {list(block.context_lengths)!r}, not "
            f"{list(gate.context_lengths)}"
        )
    rows = block.buckets
    if not rows:
        return broken("long-context block judged no bucket")
    figures = [_bucket_figures(r) for r in rows]
    worst_rows = [(r, f) for r, f in zip(rows, figures, strict=True) if r.verdict == verdict]
    if (verdict == "pass" and len(worst_rows) != len(rows)) or not worst_rows:
        return broken(f"long-context verdict {verdict} contradicts its buckets")
    if any(f is None for f in figures):
        return broken("long-context block is malformed (a bucket lacks its figures)")
    row, worst = min(worst_rows, key=lambda pair: pair[1][0] if pair[1] else 0.0)
    assert worst is not None
    _, length, control, candidate, items, lower = worst
    detail = f"control {control:.0%} vs candidate {candidate:.0%} on {items} items"
    if row.recovery is not None:
        detail += f", recovery {row.recovery:.2f} (floor {gate.recovery_floor:g})"
    if verdict == "pass":
        lengths = ", ".join(bucket_label(f[1]) for f in figures if f is not None)
        return GateResult(
            LONG_CONTEXT,
            Outcome.SUCCESSFUL,
            Reason.LONG_CONTEXT_NON_INFERIOR,
            f"long context non-inferior in every bucket ({lengths}); closest: "
            f"{bucket_label(length)} {detail}, at least {lower * 100:+.1f} pp "
            f"(margin {gate.margin_pp:g} pp)",
        )
    outcome, reason = _LC_VERDICTS[verdict]
    why = {
        "worse_than_margin": f"worse than the {gate.margin_pp:g} pp margin",
        "below_recovery_floor": f"below {gate.recovery_floor:.0%} of the control's score",
    }.get(str(row.reason), "not shown non-inferior")
    return GateResult(
        LONG_CONTEXT,
        outcome,
        reason,
        f"long-context bucket {bucket_label(length)} ({length:,} tokens): {why}: {detail}",
    )


_DIV_KIND: Final = "kvgate.diverge/summary"


def _flag_message(gate: DivergenceGate, first: DivergenceBucketRecord | None) -> str | None:
    """The first flagged bucket's figures in words (None when one is missing)."""
    f, c = (first.floor, first.candidate) if first is not None else (None, None)
    if first is None or f is None or c is None:
        return None
    low, high, kl, floor_kl = first.low, first.high, c.mean_kl, f.mean_kl
    agree, floor_agree = c.top1_agreement, f.top1_agreement
    if low is None or high is None or kl is None or floor_kl is None:
        return None
    if agree is None or floor_agree is None:
        return None
    return (
        f"token divergence above {gate.factor:g}x the A/A floor from position bucket "
        f"{low:,}-{high:,}: mean KL {kl:.3g} vs floor {floor_kl:.3g}, "
        f"top-1 agreement {agree:.0%} vs {floor_agree:.0%}"
    )


def assess_divergence(gate: DivergenceGate, summary: AccuracyStatus) -> GateResult:
    """The eval summary's `divergence` block (the screen's own summary) as an outcome.

    `require`: a flag fails, and a screen that did not run (missing block, error) is an ERROR;
    `warn`: both are WARNINGs. The message names the first flagged position bucket.
    """
    if gate.mode is GateMode.OFF:
        return GateResult(DIVERGENCE, Outcome.SKIPPED, Reason.GATE_OFF, "divergence not screened")
    bad = Outcome.FAILED if gate.mode is GateMode.REQUIRE else Outcome.WARNING
    unknown = Outcome.ERROR if gate.mode is GateMode.REQUIRE else Outcome.WARNING
    block = summary.divergence
    if block is None or block.kind != _DIV_KIND:
        return GateResult(
            DIVERGENCE,
            unknown,
            Reason.DIVERGENCE_UNKNOWN,
            "the eval summary has no divergence block, though spec.gates.divergence asks for it",
        )
    verdict = block.verdict
    if verdict == "pass":
        positions = block.positions or 0
        if block.buckets and positions > 0 and all(r.flagged is False for r in block.buckets):
            return GateResult(
                DIVERGENCE,
                Outcome.SUCCESSFUL,
                Reason.DIVERGENCE_WITHIN_FLOOR,
                f"token divergence within {gate.factor:g}x the A/A floor in every position "
                f"bucket ({positions:,} positions)",
            )
        return GateResult(
            DIVERGENCE,
            unknown,
            Reason.DIVERGENCE_UNKNOWN,
            "divergence pass contradicts its buckets",
        )
    if verdict == "flag":
        message = _flag_message(gate, block.first_flagged) or (
            "token divergence above the A/A floor in position buckets "
            f"{list(block.flagged_buckets)!r}"
        )
        return GateResult(DIVERGENCE, bad, Reason.DIVERGENCE_FLAGGED, message)
    return GateResult(
        DIVERGENCE,
        unknown,
        Reason.DIVERGENCE_UNKNOWN,
        f"divergence screen: {block.error or f'verdict {verdict!r}'}",
    )


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
        return GateResult(SPEED, Outcome.SKIPPED, Reason.GATE_OFF, "speed not checked")
    if not control_tpot_s or candidate_tpot_s is None:
        return GateResult(
            SPEED, Outcome.ERROR, Reason.SPEED_UNKNOWN, "no TPOT from the engines' metrics"
        )
    regression = candidate_tpot_s / control_tpot_s - 1.0
    tpots = f"TPOT {candidate_tpot_s * 1000:.1f} ms vs {control_tpot_s * 1000:.1f} ms"
    if clocks is not None and clocks.control is not None and clocks.candidate is not None:
        mismatch = compare_clocks(clocks.control, clocks.candidate, gate.max_clock_difference)
        if mismatch is not None:
            return GateResult(
                SPEED,
                Outcome.INCONCLUSIVE,
                Reason.CLOCKS_DIFFER,
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
        return GateResult(SPEED, Outcome.FAILED, Reason.SPEED_REGRESSED, detail)
    return GateResult(SPEED, Outcome.SUCCESSFUL, Reason.SPEED_WITHIN_LIMIT, detail)


def crash_summary(scan: ScanRecord | None, fallback: str) -> tuple[str, str | None]:
    """(what failed, remedy) from a crashed arm's log scan: the first error finding and its hint."""
    f: FindingRecord | None = crash.root_cause(scan)
    if f is not None:
        return str(f.text or f.code or fallback), f.hint or None
    tail = scan.tail if scan is not None else ()
    if tail:  # a cause the scanner does not know: the last line says most
        return f"{fallback}; last log line: {tail[-1][:300]}", None
    return fallback, None
