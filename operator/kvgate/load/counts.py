"""The client's token counts checked against the engine's own counters, per arm over a run.

inference-perf computes output tok/s and TPOT from its *own* count of each response's tokens
(the load tokenizer re-tokenizing the streamed text), while the engine counts the tokens it
generated (`vllm:generation_tokens_total`). With the served model's tokenizer the two agree; with
another one (the simulator's word tokenizer against a real model) tok/s and TPOT are in the
wrong units. So the Job reads each arm's counters before the run and after it, and the deltas
must match the clients' totals to within `TOLERANCE`; otherwise the arm is an error, not a
measurement. The prompt counter is checked too: the client records the engine's usage there,
so a mismatch means other traffic reached the arm (a canary gets none) or a counter that is not
the engine's.

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

from collections.abc import Callable, Sequence
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

    prompt_tokens: float  # as the client recorded them (the engine's usage, where it gave one)
    output_tokens: float | None  # the client's own count: the units of tok/s and TPOT
    unfinished: int  # planned requests without a successful report entry
    longest_prompt: float | None  # the longest prompt of a finished request


def client_counts(stages: Sequence[StageJudgement], planned: Sequence[int]) -> ClientCounts:
    """The run's finished requests summed over its stages (a stage without a report: all its
    planned requests unfinished)."""
    prompt, unfinished = 0.0, 0
    output: float | None = 0.0
    longest: float | None = None
    for judgement, requests in zip(stages, planned, strict=True):
        result = judgement.result
        if result is None:
            unfinished += requests
            continue
        unfinished += max(requests - result.successes, 0)
        prompt += result.prompt_tokens_total
        if result.successes:
            client_output = result.output_tokens_client
            output = None if output is None or client_output is None else output + client_output
            if result.prompt_tokens_max is not None:
                longest = max(longest or 0.0, result.prompt_tokens_max)
    return ClientCounts(prompt, output, unfinished, longest)


def _tokens(value: float) -> str:
    return f"{value:,.0f}"


def _compare(
    what: str,
    client: float,
    engine: float,
    counter: str,
    allowance: float | None,
    unfinished: int,
    cause: str,
) -> str | None:
    """None when `engine` is within TOLERANCE of `client` (plus what unfinished requests may
    have added; `allowance` None: any amount)."""
    low = client * (1 - TOLERANCE)
    high = None if allowance is None else client * (1 + TOLERANCE) + allowance
    if engine >= low and (high is None or engine <= high):
        return None
    extra = (
        f", with up to {_tokens(allowance)} more from {unfinished} unfinished requests"
        if (unfinished and allowance is not None)
        else ""
    )
    return (
        f"client counted {_tokens(client)} {what} tokens, the engine {_tokens(engine)} "
        f"({counter}{extra}): {cause}"
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
    generation, prompt = f"{engine}:generation_tokens_total", f"{engine}:prompt_tokens_total"
    problems: list[str] = []
    readers: tuple[tuple[str, str, Callable[[EngineCounters], float | None]], ...] = (
        ("output", generation, lambda c: c.generation_tokens),
        ("prompt", prompt, lambda c: c.prompt_tokens),
    )
    for what, counter, read in readers:
        start, end = (None if c is None else read(c) for c in (before, after))
        if start is None or end is None:
            problems.append(f"{counter} could not be read before and after the run: the "
                            f"client's {what} token counts are unchecked")  # fmt: skip
            continue
        if end < start:
            problems.append(f"{counter} went back ({_tokens(start)} to {_tokens(end)}): the "
                            "engine restarted during the run")  # fmt: skip
            continue
        if what == "output":
            if client.output_tokens is None:
                problems.append("the client's own output token count is missing from its "
                                "reports: tok/s and TPOT are unchecked")  # fmt: skip
                continue
            found = _compare(
                what, client.output_tokens, end - start, counter,
                client.unfinished * output_tokens, client.unfinished,
                "the load tokenizer is not the served model's",
            )  # fmt: skip
        else:
            allowance = (
                0.0 if not client.unfinished
                else None if client.longest_prompt is None
                else client.unfinished * client.longest_prompt
            )  # fmt: skip
            found = _compare(
                what, client.prompt_tokens, end - start, counter, allowance, client.unfinished,
                "other traffic reached the arm, or the client counted prompts itself",
            )  # fmt: skip
        if found:
            problems.append(found)
    return tuple(problems)
