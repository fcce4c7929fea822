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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

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


# Why the client's output count can differ from the engine's: it re-tokenizes the streamed text.
# Measured on real vLLM 0.32 with the served model's own tokenizer: a random model's byte-level
# BPE output re-merges when encoded again (15,307 counted, 21,504 generated), so the tokenizer
# is not the only suspect.
OUTPUT_CAUSE: Final = (
    "the client re-tokenizes the streamed text into other tokens than the engine generated "
    "(a load tokenizer that is not the served model's, or output that does not re-tokenize "
    "to itself)"
)
PROMPT_CAUSE: Final = "other traffic reached the arm, or the client counted prompts itself"


def _checked(
    counter: str,
    what: str,
    span: tuple[float | None, float | None],
    client: float | None,
    allowance: float | None,
    unfinished: int,
    cause: str,
) -> str | None:
    """Why the client's `what` total disagrees with the counter's increase over the run
    (`span`: before, after), None when it agrees."""
    start, end = span
    if start is None or end is None:
        return (f"{counter} could not be read before and after the run: the client's {what} "
                "token counts are unchecked")  # fmt: skip
    if end < start:
        return (f"{counter} went back ({_tokens(start)} to {_tokens(end)}): the engine "
                "restarted during the run")  # fmt: skip
    if client is None:
        return (f"the client's own {what} token count is missing from its reports: tok/s and "
                "TPOT are unchecked")  # fmt: skip
    return _compare(what, client, end - start, counter, allowance, unfinished, cause)


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
                 client.unfinished * output_tokens, client.unfinished, OUTPUT_CAUSE),
        _checked(f"{engine}:prompt_tokens_total", "prompt", (b.prompt_tokens, a.prompt_tokens),
                 client.prompt_tokens, prompt_allowance, client.unfinished, PROMPT_CAUSE),
    )  # fmt: skip
    return tuple(problem for problem in found if problem)
