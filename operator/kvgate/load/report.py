"""inference-perf's per-stage JSON reports, read into typed results and judged.

inference-perf exits 0 on broken runs: an unreachable server gives every request a
connection error, and an engine that dies mid-run has its cut-off streams counted as
successes (visible only as `client_fallback_requests` and short outputs). So each stage
is judged from its own `stage_<N>_lifecycle_metrics.json`: a stage is `measured` only when
every planned request ran and succeeded with the full output; anything else, a missing
or unreadable report included, is an `error`, never a measurement.

Pure: takes the report files' text, returns data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from kvgate.load.config import LoadPlan

VALIDATION_FILE = "validation.json"


def stage_file(stage: int) -> str:
    return f"stage_{stage}_lifecycle_metrics.json"


class ReportError(ValueError):
    """A report file that is not what inference-perf writes; the message names file and field."""


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float


@dataclass(frozen=True)
class StageResult:
    """One stage as inference-perf measured it (client wall-clock seconds)."""

    stage: int
    concurrency: int
    requests: int  # sent (load_summary.count)
    successes: int
    failures: int
    failures_by_label: tuple[tuple[str, int], ...]
    duration_s: float
    output_tokens_per_s: float
    prompt_tokens_total: float
    output_tokens_total: float
    output_tokens_min: float | None  # None: no successful request
    fallback_prompt: int  # requests whose tokens the client counted itself
    fallback_output: int
    token_count_mismatches: int
    ttft_s: Percentiles | None
    tpot_s: Percentiles | None
    itl_s: Percentiles | None
    goodput_percentage: float | None
    # The shortest and longest prompt as the engine counted them (its usage). None: no success.
    prompt_tokens_min: float | None = None
    prompt_tokens_max: float | None = None


Status = Literal["measured", "error"]


@dataclass(frozen=True)
class StageJudgement:
    stage: int
    status: Status
    reasons: tuple[str, ...]  # why it is an error; empty when measured
    result: StageResult | None  # None when the report is missing or unreadable

    @property
    def measured(self) -> StageResult | None:
        """The result only if it may be used as a measurement."""
        return self.result if self.status == "measured" else None


def _field(data: Mapping[str, Any], path: str, source: str) -> Any:
    value: Any = data
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise ReportError(f"{source}: no field {path}")
        value = value[key]
    return value


def _number(data: Mapping[str, Any], path: str, source: str) -> float:
    value = _field(data, path, source)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReportError(f"{source}: {path} is not a number ({value!r})")
    return float(value)


def _count(data: Mapping[str, Any], path: str, source: str) -> int:
    value = _number(data, path, source)
    if value < 0 or value != int(value):
        raise ReportError(f"{source}: {path} is not a count ({value!r})")
    return int(value)


def _percentiles(data: Mapping[str, Any], path: str, source: str) -> Percentiles | None:
    """None where inference-perf writes null (no successful request)."""
    if _field(data, path, source) is None:
        return None
    return Percentiles(
        p50=_number(data, f"{path}.median", source), p99=_number(data, f"{path}.p99", source)
    )


def parse_stage(text: str, stage: int, source: str | None = None) -> StageResult:
    """One `stage_<N>_lifecycle_metrics.json`; ReportError names the file and field."""
    source = source or stage_file(stage)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ReportError(f"{source}: not JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise ReportError(f"{source}: not a JSON object")
    labels = _field(data, "failures.by_label", source)
    if not isinstance(labels, Mapping):
        raise ReportError(f"{source}: failures.by_label is not an object")
    by_label = tuple(
        sorted((str(label), _count(labels, f"{label}.count", source)) for label in labels)
    )
    number = partial(_number, data, source=source)
    count = partial(_count, data, source=source)
    latency = partial(_percentiles, data, source=source)
    successes = count("successes.count")

    def tokens(path: str) -> float | None:  # null where no request succeeded
        return number(path) if successes > 0 else None

    output_min = tokens("successes.output_tokens.min")
    goodput = data["successes"].get("goodput_metrics")
    return StageResult(
        stage=stage,
        concurrency=count("load_summary.concurrency"),
        requests=count("load_summary.count"),
        successes=successes,
        failures=count("failures.count"),
        failures_by_label=by_label,
        duration_s=number("benchmark_time_seconds"),
        output_tokens_per_s=number("successes.throughput.output_tokens_per_sec"),
        prompt_tokens_total=number("successes.prompt_tokens.total"),
        output_tokens_total=number("successes.output_tokens.total"),
        output_tokens_min=output_min,
        fallback_prompt=count("successes.client_fallback_requests.prompt"),
        fallback_output=count("successes.client_fallback_requests.output"),
        token_count_mismatches=count("successes.token_count_mismatches"),
        ttft_s=latency("successes.latency.time_to_first_token"),
        tpot_s=latency("successes.latency.time_per_output_token"),
        itl_s=latency("successes.latency.inter_token_latency"),
        goodput_percentage=(
            number("successes.goodput_metrics.goodput_percentage")
            if isinstance(goodput, Mapping)
            else None
        ),
        prompt_tokens_min=tokens("successes.prompt_tokens.min"),
        prompt_tokens_max=tokens("successes.prompt_tokens.max"),
    )


def validation_errors(text: str | None) -> dict[str, tuple[str, ...]]:
    """inference-perf's own validation.json errors per report file (warnings are ignored)."""
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {VALIDATION_FILE: (f"{VALIDATION_FILE}: not JSON",)}
    found: dict[str, tuple[str, ...]] = {}
    reports = data.get("reports", {}) if isinstance(data, Mapping) else {}
    for name, entry in (reports if isinstance(reports, Mapping) else {}).items():
        errors = entry.get("errors") if isinstance(entry, Mapping) else None
        if errors:
            found[str(name)] = tuple(
                str(e.get("message", e)) if isinstance(e, Mapping) else str(e) for e in errors
            )
    return found


# How far the engine's count of a prompt may stray from the plan's before the load tokenizer is
# taken for another model's. With the served model's tokenizer it is exact (real vLLM 0.32: every
# 512-token prompt counted 512); with a word tokenizer against a BPE model, 1,269 to 1,378.
PROMPT_TOLERANCE = 0.01


def _prompt_mismatch(result: StageResult, bounds: tuple[int, int]) -> str | None:
    """Why the engine's prompt lengths are not the plan's, None when they are."""
    low, high = bounds
    if result.prompt_tokens_min is None or result.prompt_tokens_max is None:
        return None
    seen_low, seen_high = result.prompt_tokens_min, result.prompt_tokens_max
    if seen_low >= low * (1 - PROMPT_TOLERANCE) and seen_high <= high * (1 + PROMPT_TOLERANCE):
        return None
    planned = f"{low:,}" if low == high else f"{low:,} to {high:,}"
    seen = f"{seen_low:,.0f}" if seen_low == seen_high else f"{seen_low:,.0f} to {seen_high:,.0f}"
    return (
        f"prompts planned at {planned} tokens reached the engine as {seen} "
        "(its usage): the load tokenizer is not the served model's"
    )


def judge_stage(
    result: StageResult,
    num_requests: int,
    output_tokens: int,
    errors: tuple[str, ...] = (),
    prompt_bounds: tuple[int, int] | None = None,
) -> StageJudgement:
    """`measured` only if all `num_requests` ran and succeeded with `output_tokens` each, and
    the engine counted each prompt as the plan's `prompt_bounds` say (when given)."""
    reasons: list[str] = []
    if result.failures:
        labels = ", ".join(f"{label}: {count}" for label, count in result.failures_by_label)
        reasons.append(f"{result.failures} of {result.requests} requests failed ({labels})")
    if result.requests < num_requests or result.successes + result.failures < num_requests:
        reasons.append(
            f"{result.successes + result.failures} of {num_requests} planned requests ran"
        )
    if result.successes == 0:
        reasons.append("no request succeeded")
    if result.fallback_prompt or result.fallback_output:
        reasons.append(
            f"{result.fallback_output} responses without usage (the client counted the tokens "
            f"itself: a cut-off stream) and {result.fallback_prompt} prompts"
        )
    if result.output_tokens_min is not None and result.output_tokens_min < output_tokens:
        reasons.append(f"short outputs: min {result.output_tokens_min:g} of {output_tokens} tokens")
    if prompt_bounds is not None and (mismatch := _prompt_mismatch(result, prompt_bounds)):
        reasons.append(mismatch)
    reasons += [f"inference-perf's validation: {error}" for error in errors]
    status: Status = "error" if reasons else "measured"
    return StageJudgement(result.stage, status, tuple(reasons), result)


def judge_reports(plan: LoadPlan, files: Mapping[str, str]) -> tuple[StageJudgement, ...]:
    """Every planned stage judged from the report files (name -> text) of one run."""
    checks = validation_errors(files.get(VALIDATION_FILE))
    judgements: list[StageJudgement] = []
    for number, stage in enumerate(plan.stages):
        name = stage_file(number)
        text = files.get(name)
        try:
            if text is None:
                raise ReportError(f"no report {name}")
            result = parse_stage(text, number, name)
        except ReportError as exc:
            judgements.append(StageJudgement(number, "error", (str(exc),), None))
            continue
        judgements.append(
            judge_stage(
                result,
                stage.num_requests,
                plan.output_tokens,
                checks.get(name, ()),
                plan.prompt_bounds(),
            )
        )
    return tuple(judgements)
