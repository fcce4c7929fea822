"""What does FP8 buy, measured? The throughput gate, from the load Job's summary.

The gate reads both arms' stages at production's concurrency: an arm *serves* a stage when the
stage was measured (no failures, no cut-off streams, every planned request) and met the SLOs.
- both serve: the gain is candidate / control output tok/s there; at least `minRatio` is a gain,
  less is NotNeeded (production's load is not where the KV cache limits);
- only the candidate serves: the capacity case (the control runs out of KV cache): a gain,
  quoted against the control's best stage;
- the candidate does not serve it: Failed;
- arms at different GPU clocks: no throughput claim (Inconclusive), as for the speed gate;
- before any of these, a candidate whose output is degenerate or whose prefix caching is off
  where the control's is on is Failed (`kvgate.judge.outputcheck`).
Pure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Final

from kvgate.evidence.metrics import Histogram
from kvgate.judge.gates import THROUGHPUT, compare_clocks
from kvgate.judge.outputcheck import refusal
from kvgate.reasons import Reason
from kvgate.records.loadresult import (
    ArmLoad,
    LoadSummary,
    LoadVerdict,
    StagePoint,
    sim_time_note,
    time_scale,
)
from kvgate.records.status import ClocksRecord, GateResult, PoolSample, PreflightStatus
from kvgate.spec.rollout import ThroughputGainGate
from kvgate.vocabulary import PROMETHEUS_SOURCE, Outcome


@dataclass(frozen=True, slots=True)
class ThroughputFinding:
    result: GateResult
    gain: float | None = None  # candidate / control output tok/s at production's load
    best_gain: float | None = None  # candidate's best served stage / control's best


def slo_miss(stage: StagePoint, gate: ThroughputGainGate) -> str | None:
    """Why a measured stage misses the spec's SLOs (None: it meets them, or there are none)."""
    misses = [
        f"{name} p99 {value:,.0f} ms over the SLO {limit:,.0f} ms"
        for name, value, limit in (
            ("TTFT", stage.ttft_p99_ms, gate.ttft_p99_ms),
            ("TPOT", stage.tpot_p99_ms, gate.tpot_p99_ms),
        )
        if limit is not None and value is not None and value > limit
    ]
    return "; ".join(misses) or None


def serves(stage: StagePoint | None, gate: ThroughputGainGate) -> bool:
    return (
        stage is not None
        and stage.measured
        and stage.output_tokens_per_s is not None
        and slo_miss(stage, gate) is None
    )


def why_not(stage: StagePoint | None, gate: ThroughputGainGate) -> str:
    if stage is None:
        return "not run"
    if not stage.measured:
        return "; ".join(stage.reasons[:2]) or "not measured"
    return slo_miss(stage, gate) or "no throughput figure"


def best(arm: ArmLoad, gate: ThroughputGainGate) -> StagePoint | None:
    served = [s for s in arm.stages if serves(s, gate)]
    return max(served, key=lambda s: s.output_tokens_per_s or 0.0, default=None)


def _tok(stage: StagePoint) -> str:
    return f"{stage.output_tokens_per_s or 0:,.0f} tok/s"


def tpot_clause(
    control: ArmLoad, candidate: ArmLoad, production: int, gate: ThroughputGainGate
) -> str | None:
    """TPOT p50 change where both arms serve: the highest such concurrency up to production's."""
    both = [
        (c, k)
        for c in control.stages
        if serves(c, gate)
        and c.concurrency is not None
        and (k := candidate.at(c.concurrency)) is not None
        and serves(k, gate)
        and c.tpot_p50_ms
        and k.tpot_p50_ms
    ]
    if not both:
        return None
    below = [pair for pair in both if (pair[0].concurrency or 0) <= production] or both
    c, k = max(below, key=lambda pair: pair[0].concurrency or 0)
    assert c.tpot_p50_ms and k.tpot_p50_ms
    return f"TPOT {k.tpot_p50_ms / c.tpot_p50_ms - 1:+.0%} at {c.concurrency} concurrent"


def _per_arm(
    title: str, control: float | None, candidate: float | None, labels: tuple[str, str], unit: str
) -> str | None:
    if control is None or candidate is None:
        return None
    ctl, cand = labels
    return f"{title}: {ctl} {control:,.0f}{unit}, {cand} {candidate:,.0f}{unit}"


def preemption_clause(
    control: ArmLoad, candidate: ArmLoad, labels: tuple[str, str], production: int
) -> str | None:
    """How often each engine preempted (or retracted) requests: the pool running out, seen
    from the engine's side. At production's load when both stages counted it, else over the
    whole load."""
    at_c, at_k = control.at(production), candidate.at(production)
    if at_c is not None and at_k is not None:
        title = f"preemptions at {production} concurrent"
        found = _per_arm(title, at_c.preemptions, at_k.preemptions, labels, "")
        if found is not None:
            return found
    title = "preemptions during the load"
    return _per_arm(title, control.preemptions, candidate.preemptions, labels, "")


def goodput_clause(
    control: StagePoint | None, candidate: StagePoint | None, labels: tuple[str, str]
) -> str | None:
    """The share of production-load requests that met every SLO, per arm (inference-perf's
    goodput)."""
    return _per_arm(
        "requests within the SLOs",
        control.goodput_percent if control is not None else None,
        candidate.goodput_percent if candidate is not None else None,
        labels,
        "%",
    )


def assess_throughput(
    gate: ThroughputGainGate | None,
    load: LoadSummary | None,
    clocks: ClocksRecord | None = None,
    *,
    production_concurrency: int | None = None,
    labels: tuple[str, str] = ("control", "candidate"),
) -> ThroughputFinding:
    """The throughput gate: what the candidate buys at production's load, in one line.

    `production_concurrency`: production's load as the operator read it; a load run made for
    another load proves nothing about this one. On a sped-up simulator the line says its
    figures are wall-clock ones of a faster engine."""
    found = _assess(gate, load, clocks, production_concurrency, labels)
    scale = time_scale(load.control, load.candidate) if load is not None else None
    if scale is None or found.result.outcome in (Outcome.SKIPPED, Outcome.ERROR):
        return found
    note = sim_time_note(scale)
    return dataclasses.replace(
        found, result=dataclasses.replace(found.result, message=f"{found.result.message}; {note}")
    )


def _assess(
    gate: ThroughputGainGate | None,
    load: LoadSummary | None,
    clocks: ClocksRecord | None,
    production_concurrency: int | None,
    labels: tuple[str, str],
) -> ThroughputFinding:
    if gate is None:
        return _found(Outcome.SKIPPED, Reason.GATE_OFF, "throughput not measured")
    control = load.control if load is not None else None
    candidate = load.candidate if load is not None else None
    production = load.production_concurrency if load is not None else None
    if load is None or control is None or candidate is None or production is None:
        return _unknown("no load summary")
    if production_concurrency is not None and production_concurrency != production:
        return _unknown(
            f"the load ran for production concurrency {production}, production is at "
            f"{production_concurrency}"
        )
    if load.verdict is LoadVerdict.ERROR or control.error or candidate.error:
        return _unknown(f"the load run failed: {load.error or 'an arm measured nothing'}")
    refused = refusal(control, candidate)
    if refused is not None:  # whatever tok/s it measured (kvgate.judge.outputcheck)
        return _found(Outcome.FAILED, *refused)
    if clocks is not None and clocks.known and clocks.control and clocks.candidate:
        mismatch = compare_clocks(clocks.control, clocks.candidate, gate.max_clock_difference)
        if mismatch is not None:
            no_claim = f"no throughput claim: the arms ran at different GPU clocks: {mismatch}"
            return _found(Outcome.INCONCLUSIVE, Reason.CLOCKS_DIFFER, no_claim)
    ctl, cand = labels
    at_c, at_k = control.at(production), candidate.at(production)
    best_c = best(control, gate)
    best_gain = _gain(best(candidate, gate), best_c)
    tpot = tpot_clause(control, candidate, production, gate)
    preempted = preemption_clause(control, candidate, labels, production)
    goodput = goodput_clause(at_c, at_k, labels)
    tail = "".join(f"; {clause}" for clause in (goodput, tpot, preempted) if clause)
    where = f"at production load {production}"
    if not serves(at_k, gate):
        if serves(at_c, gate):
            assert at_c is not None
            message = (
                f"{where}: {cand} does not serve it ({why_not(at_k, gate)}), {ctl} makes "
                f"{_tok(at_c)}{tail}"
            )
        else:
            message = (
                f"{where}: neither arm serves it ({ctl}: {why_not(at_c, gate)}; {cand}: "
                f"{why_not(at_k, gate)}): the candidate does not relieve the bottleneck"
            )
        return _found(Outcome.FAILED, Reason.THROUGHPUT_NOT_GAINED, message, best_gain=best_gain)
    assert at_k is not None
    if not serves(at_c, gate):
        # The capacity case: the control fails where the candidate serves.
        versus = (
            f"; {ctl}'s best {_tok(best_c)} at {best_c.concurrency}, "
            f"{(at_k.output_tokens_per_s or 0) / (best_c.output_tokens_per_s or 1) - 1:+.0%}"
            if best_c is not None and best_c.output_tokens_per_s
            else ""
        )
        message = (
            f"{where}: {cand} {_tok(at_k)}, {ctl} does not serve it ({why_not(at_c, gate)})"
            f"{versus}{tail}"
        )
        gain = _gain(at_k, best_c)
        return _found(Outcome.SUCCESSFUL, Reason.THROUGHPUT_GAINED, message, gain, best_gain)
    assert at_c is not None and at_c.output_tokens_per_s
    ratio = (at_k.output_tokens_per_s or 0) / at_c.output_tokens_per_s
    message = (
        f"{where}: {_tok(at_k)} vs {_tok(at_c)}, {ratio - 1:+.0%} (at least "
        f"{gate.min_ratio:g}x asked){tail}"
    )
    if best_gain is not None:
        message += f"; best stages {best_gain:.2f}x"
    if ratio >= gate.min_ratio:
        outcome, reason = Outcome.SUCCESSFUL, Reason.THROUGHPUT_GAINED
    else:
        outcome, reason = Outcome.NOT_NEEDED, Reason.THROUGHPUT_NOT_NEEDED
        message += ": both arms serve production's load, the KV cache is not what limits it"
    return _found(outcome, reason, message, round(ratio, 4), best_gain)


def _gain(stage: StagePoint | None, base: StagePoint | None) -> float | None:
    """`stage`'s output tok/s over `base`'s, rounded (None without both)."""
    if stage is None or base is None or not base.output_tokens_per_s:
        return None
    return round((stage.output_tokens_per_s or 0) / base.output_tokens_per_s, 4)


def _found(
    outcome: Outcome,
    reason: Reason,
    message: str,
    gain: float | None = None,
    best_gain: float | None = None,
) -> ThroughputFinding:
    return ThroughputFinding(GateResult(THROUGHPUT, outcome, reason, message), gain, best_gain)


def _unknown(why: str) -> ThroughputFinding:
    return _found(Outcome.ERROR, Reason.THROUGHPUT_UNKNOWN, f"no throughput: {why}")


# The load Job's workload when production's request-length histograms cannot be read: the
# lengths `kvgate load-job`'s example and the field report's sweep use.
DEFAULT_PROMPT_TOKENS: Final = 512
DEFAULT_OUTPUT_TOKENS: Final = 128
# Lengths are taken from production only once this many requests finished in the histograms.
MIN_LENGTH_REQUESTS: Final = 10
# The load Job's bounds on a derived length (a runaway histogram must not plan a 10M prompt).
MAX_PROMPT_TOKENS: Final = 1_000_000
MAX_OUTPUT_TOKENS: Final = 100_000
# Where production's request-length totals were read (`RequestLengths.message`).
FROM_PODS: Final = "the pods' /metrics"
FROM_PROMETHEUS: Final = "Prometheus"


@dataclass(frozen=True, slots=True)
class RequestLengths:
    """The load Job's workload shape. `derived`: read from production's request-length
    histograms; False: the fixed defaults, and `message` says why."""

    prompt_tokens: int
    output_tokens: int
    derived: bool
    message: str


def request_lengths(
    prompt: Histogram | None,
    output: Histogram | None,
    *,
    source: str = FROM_PODS,
) -> RequestLengths:
    """Production's request lengths for the load Job, from its request-length histograms
    (vLLM `vllm:request_prompt_tokens` / `vllm:request_generation_tokens`, SGLang's
    `*_tokens_histogram`; a window's `since()` delta when there is one): means from sum /
    count. No spread: a 1-2-5 bucket's midpoint is no estimate of it (every prompt of 1,800
    tokens in (1000, 2000] would read as a spread of 300). Too few requests: the defaults."""

    def fallback(why: str) -> RequestLengths:
        return RequestLengths(
            DEFAULT_PROMPT_TOKENS,
            DEFAULT_OUTPUT_TOKENS,
            derived=False,
            message=(
                f"production's request lengths unread from {source} ({why}): the load runs "
                f"the fixed {DEFAULT_PROMPT_TOKENS} prompt / {DEFAULT_OUTPUT_TOKENS} output tokens"
            ),
        )

    for name, histogram in (("prompt", prompt), ("output", output)):
        if histogram is None:
            return fallback(f"no {name}-length histogram")
        if histogram.count < MIN_LENGTH_REQUESTS:
            return fallback(
                f"{histogram.count:g} requests in the {name}-length histogram, fewer than "
                f"{MIN_LENGTH_REQUESTS}"
            )
    assert prompt is not None and output is not None
    prompt_mean = prompt.sum / prompt.count
    output_mean = output.sum / output.count
    if not (math.isfinite(prompt_mean) and math.isfinite(output_mean)):
        return fallback("a histogram's sum is not a number")
    prompt_tokens = min(max(1, round(prompt_mean)), MAX_PROMPT_TOKENS)
    output_tokens = min(max(1, round(output_mean)), MAX_OUTPUT_TOKENS)
    return RequestLengths(
        prompt_tokens,
        output_tokens,
        derived=True,
        message=(
            f"production's request lengths from {source} over {prompt.count:g} requests: "
            f"prompt mean {prompt_tokens}, output mean {output_tokens} tokens"
        ),
    )


def production_concurrency(preflight: PreflightStatus | None) -> int:
    """Production's load on one replica: the busiest pod's mean running + waiting requests over
    the preflight samples, rounded (at least 1, also when preflight recorded none)."""
    busiest = 0.0
    for samples in (preflight.samples if preflight is not None else {}).values():
        loads = [
            (s.running or 0.0) + (s.waiting or 0.0)
            for s in samples
            if s.running is not None or s.waiting is not None
        ]
        if loads:
            busiest = max(busiest, sum(loads) / len(loads))
    return max(1, round(busiest))


def production_lengths(preflight: PreflightStatus | None) -> RequestLengths:
    """`request_lengths` of the preflight's latest sample with length totals (the busiest pod's
    when several have them). Means only: status keeps the histograms' sums and counts, not
    their buckets."""
    source = (
        FROM_PROMETHEUS
        if preflight is not None and preflight.source == PROMETHEUS_SOURCE
        else FROM_PODS
    )
    best: PoolSample | None = None
    for samples in (preflight.samples if preflight is not None else {}).values():
        latest = next(
            (s for s in reversed(samples) if s.prompt_len_count and s.output_len_count), None
        )
        if latest is not None and (
            best is None or (latest.prompt_len_count or 0) > (best.prompt_len_count or 0)
        ):
            best = latest
    if best is None:
        return request_lengths(None, None, source=source)
    return request_lengths(
        Histogram((), best.prompt_len_sum or 0.0, best.prompt_len_count or 0.0),
        Histogram((), best.output_len_sum or 0.0, best.output_len_count or 0.0),
        source=source,
    )
