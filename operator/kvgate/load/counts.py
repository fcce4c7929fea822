"""The client's token counts checked against the engine's own counters, per arm over a run.

inference-perf computes output tok/s and TPOT from the engine's usage of each response (the
Job sets `use_server_output_tokens`: re-tokenizing the streamed text counts other tokens than
the engine generated, on real vLLM by 19%), and records each prompt's length as the engine's
usage too. Summed over the run, the usage must equal the increase of the engine's counters
(`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`) to within `TOLERANCE`; otherwise
other traffic reached the arm (a canary gets none) or the counters are not this engine's, and
the arm is an error, not a measurement. Whether the load tokenizer is the served model's is
judged per stage from the prompts' lengths (`report.judge_stage`).

Only finished requests are in the client's totals, while the engine also counted what it did for
requests that did not finish (failed, timed out, cut at a stage's end, then aborted): each such
request may add up to the plan's `output_tokens` (the engine stops at max_tokens) and one prompt
(at most the longest the client saw) to the engine's side. So the check is exact when every
request finished and one-sided by that allowance otherwise; a stage with unfinished requests is
an error on its own anyway. The counters are read around the whole run, not each stage: stages
follow each other within a second, and a per-stage read would race their boundaries.

Pure: takes counts, returns the problems found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.load.report import StageJudgement

TOLERANCE = 0.01


@dataclass(frozen=True)
class EngineCounters:
    """An engine's cumulative token counters at one moment (None: not exported or unreadable)."""

    prompt_tokens: float | None
    generation_tokens: float | None


@dataclass(frozen=True)
class ClientCounts:
    """What the load tool counted over a run's finished requests."""

    prompt_tokens: float  # the engine's usage, as the client recorded it
    output_tokens: float  # the same: the units of tok/s and TPOT
    unfinished: int  # planned requests without a successful report entry
    longest_prompt: float | None  # the longest prompt of a finished request


def client_counts(stages: Sequence[StageJudgement], planned: Sequence[int]) -> ClientCounts:
    """The run's finished requests summed over its stages (a stage without a report: all its
    planned requests unfinished)."""
    prompt, output, unfinished = 0.0, 0.0, 0
    longest: float | None = None
    for judgement, requests in zip(stages, planned, strict=True):
        result = judgement.result
        if result is None:
            unfinished += requests
            continue
        unfinished += max(requests - result.successes, 0)
        prompt += result.prompt_tokens_total
        output += result.output_tokens_total
        if result.prompt_tokens_max is not None:
            longest = max(longest or 0.0, result.prompt_tokens_max)
    return ClientCounts(prompt, output, unfinished, longest)


def _tokens(value: float) -> str:
    return f"{value:,.0f}"


def _checked(
    counter: str,
    what: str,
    span: tuple[float | None, float | None],
    client: float,
    allowance: float | None,
    unfinished: int,
) -> str | None:
    """Why the client's `what` total disagrees with the counter's increase over the run
    (`span`: before, after), None when it is within TOLERANCE (plus what unfinished requests
    may have added; `allowance` None: any amount)."""
    start, end = span
    if start is None or end is None:
        return (f"{counter} could not be read before and after the run: the client's {what} "
                "token counts are unchecked")  # fmt: skip
    if end < start:
        return (f"{counter} went back ({_tokens(start)} to {_tokens(end)}): the engine "
                "restarted during the run")  # fmt: skip
    engine = end - start
    high = None if allowance is None else client * (1 + TOLERANCE) + allowance
    if engine >= client * (1 - TOLERANCE) and (high is None or engine <= high):
        return None
    extra = (
        f", with up to {_tokens(allowance)} more from {unfinished} unfinished requests"
        if (unfinished and allowance is not None)
        else ""
    )
    return (
        f"client counted {_tokens(client)} {what} tokens, the engine {_tokens(engine)} "
        f"({counter}{extra}): other traffic reached the arm, or the counter is not this engine's"
    )


def check_counts(
    client: ClientCounts,
    before: EngineCounters | None,
    after: EngineCounters | None,
    *,
    output_tokens: int,
    engine: str = "vllm",
) -> tuple[str, ...]:
    """Why the client's counts cannot be trusted against the engine's (empty: they agree)."""
    b, a = before or EngineCounters(None, None), after or EngineCounters(None, None)
    # each unfinished request may have added up to max_tokens and one prompt (the longest seen)
    prompt_allowance = (
        0.0 if not client.unfinished
        else None if client.longest_prompt is None
        else client.unfinished * client.longest_prompt
    )  # fmt: skip
    found = (
        _checked(f"{engine}:generation_tokens_total", "output",
                 (b.generation_tokens, a.generation_tokens), client.output_tokens,
                 client.unfinished * output_tokens, client.unfinished),
        _checked(f"{engine}:prompt_tokens_total", "prompt", (b.prompt_tokens, a.prompt_tokens),
                 client.prompt_tokens, prompt_allowance, client.unfinished),
    )  # fmt: skip
    return tuple(problem for problem in found if problem)
