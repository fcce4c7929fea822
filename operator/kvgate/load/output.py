"""What did an arm's responses hold? inference-perf's per-request report, read for the output.

A throughput figure counts tokens, not what they say: an FP8 KV bug that emitted every second
token twice (intel/llm-scaler#721) measured faster in the harnesses that ran it. So the load Job
asks inference-perf for `per_request_lifecycle_metrics.json` (the response metadata only) and
reads, per successful request, the streamed text pieces (one per SSE chunk of its `response`,
the raw body inference-perf 0.7.0 keeps there) and the engine's usage (`completion_tokens`):
- a piece equal to the piece before it in the same response is *repeated*; a sound model repeats
  seldom, a duplicating engine half the time (compared across arms by `kvgate.judge.outputcheck`);
- a response whose usage is not the `max_tokens` asked (the plan sets `ignore_eos`), or that
  streamed more pieces than its usage counts, has the *wrong length*.

Pure: takes the report's text, returns `OutputFigures`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

from kvgate.records.loadresult import OutputFigures

PER_REQUEST_FILE: Final = "per_request_lifecycle_metrics.json"
EXAMPLE_CHARS: Final = 160


def _pieces(raw_sse: str) -> Iterator[str]:
    """The text of each completion chunk of an SSE body (`data: {...}` lines; [DONE] ends it)."""
    for line in raw_sse.splitlines():
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        choices = chunk.get("choices") if isinstance(chunk, Mapping) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            continue
        text = choices[0].get("text")
        if isinstance(text, str) and text:
            yield text


def _get(entry: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(entry, Mapping):
            return None
        entry = entry.get(key)
    return entry


def read_output(text: str | None, output_tokens: int) -> OutputFigures | None:
    """The figures over every successful request of the report (None: no report, or not one);
    `output_tokens` is what each request asked for."""
    if text is None:
        return None
    try:
        entries = json.loads(text)
    except ValueError:
        return None
    if not isinstance(entries, list):
        return None
    requests = pieces = repeated = wrong = 0
    wrong_example: str | None = None
    repeat_example: str | None = None
    worst = 0.0
    for entry in entries:
        if _get(entry, "error") is not None:
            continue  # a failed request: counted by the stage's failures, not here
        raw = _get(entry, "response")
        if not isinstance(raw, str):
            continue
        texts = list(_pieces(raw))
        requests += 1
        pieces += len(texts)
        same = sum(1 for a, b in itertools.pairwise(texts) if a == b)
        repeated += same
        usage = _get(entry, "info", "response_metrics", "server_usage", "completion_tokens")
        counted = usage if isinstance(usage, int) and not isinstance(usage, bool) else None
        if counted is None or counted != output_tokens or len(texts) > counted:
            wrong += 1
            if wrong_example is None:
                shown = "no usage" if counted is None else f"usage {counted}"
                wrong_example = (
                    f"{shown} for {output_tokens} tokens asked, {len(texts)} pieces: "
                    + "".join(texts)[:EXAMPLE_CHARS]
                )
        if len(texts) > 1 and same / (len(texts) - 1) > worst:
            worst = same / (len(texts) - 1)
            repeat_example = "".join(texts)[:EXAMPLE_CHARS]
    return OutputFigures(
        requests=requests,
        pieces=pieces,
        repeated=repeated,
        wrong_length=wrong,
        example=wrong_example or repeat_example,
    )
