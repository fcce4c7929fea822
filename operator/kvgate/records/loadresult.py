"""The load Job's summary as typed data: per arm, per stage, what inference-perf measured.

`kvgate load-job` writes it as its log's last line (`kind` `kvgate.load/summary`); the gate and
the report read it back. `LoadSummary.from_dict` is total, like the status's: any JSON value
reads without raising, a field of the wrong type reads as unknown (None or empty). A stage is a
measurement only when its `status` is `measured`; an `error` stage carries its reasons and no
figures are to be taken from it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Final

from kvgate.records.codec import key as _key
from kvgate.records.codec import read_record
from kvgate.records.codec import write as _write
from kvgate.records.joblog import json_object

SUMMARY_KIND: Final = "kvgate.load/summary"
PROGRESS_KIND: Final = "kvgate.load/progress"
ARMS: Final = ("control", "candidate")


class StageStatus(enum.StrEnum):
    MEASURED = "measured"
    ERROR = "error"  # failures, cut-off streams, short outputs or no report: not a measurement


class LoadVerdict(enum.StrEnum):
    MEASURED = "measured"  # every stage of both arms
    PARTIAL = "partial"  # some stages are errors (an arm ran out of room, or died), some measured
    ERROR = "error"  # no stage of an arm measured, or the Job itself failed


@dataclass(frozen=True, slots=True)
class StagePoint:
    """One stage of one arm. Latencies in milliseconds (p50 and p99 of the successful requests)."""

    concurrency: int | None = None
    requests: int | None = None  # planned
    status: StageStatus | None = None
    successes: int | None = None
    failures: int | None = None
    output_tokens_per_s: float | None = _key("outputTokensPerS")
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    # Requests that met every SLO of the spec, in percent (inference-perf's goodput; None: no
    # SLO given, or the stage was not measured)
    goodput_percent: float | None = None
    reasons: tuple[str, ...] = _key(default=())
    # The engine's side of the stage, from the load Job's scrape of its /metrics once a second:
    # its preemptions (vLLM) or retractions (SGLang) while the stage ran, and the most requests
    # it held waiting. None: not exported or not readable. Kept for a stage that is an error too.
    preemptions: float | None = None
    max_waiting: float | None = None

    @property
    def measured(self) -> bool:
        return self.status is StageStatus.MEASURED


@dataclass(frozen=True, slots=True)
class OutputFigures:
    """What one arm's finished requests returned, from inference-perf's per-request report
    (`kvgate.load.output`): the text pieces streamed (one per chunk), those equal to the piece
    before them in the same response, and the requests whose length was not the one asked
    (the engine's usage against max_tokens, or more pieces than the usage counts)."""

    requests: int | None = None
    pieces: int | None = None
    repeated: int | None = None
    wrong_length: int | None = None
    example: str | None = None  # the first wrong-length or most-repeated response, cut short

    @property
    def repeated_share(self) -> float | None:
        if self.pieces is None or self.repeated is None or self.requests is None:
            return None
        pairs = self.pieces - self.requests  # each response's first piece has none before it
        return self.repeated / pairs if pairs > 0 else None


SGLANG_SWITCH: Final = "server_info.disable_radix_cache"  # PrefixProbe.switch of an SGLang arm


@dataclass(frozen=True, slots=True)
class PrefixProbe:
    """One arm's prefix cache, probed before its load: the same prompt sent twice, and the
    engine's prefix cache counters across both, in tokens (vLLM `prefix_cache_queries`/`_hits`;
    SGLang `prompt_tokens`/`cached_tokens`, kvgate.evidence.metrics.COUNTERS); `enabled` is whether the
    engine says its prefix cache is on, read from `switch` (vLLM: cache_config_info's
    enable_prefix_caching; SGLang: /server_info's disable_radix_cache); None: not said."""

    queries: float | None = None
    hits: float | None = None
    enabled: bool | None = None
    error: str | None = None
    switch: str | None = None  # where `enabled` was read (None: vLLM's cache_config_info)

    @property
    def hit_rate(self) -> float | None:
        if self.queries is None or self.hits is None:
            return None
        return self.hits / self.queries if self.queries > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ArmLoad:
    """One arm's run: its stages in the order they ran, and why the run broke if it did."""

    url: str | None = None
    exit_code: int | None = None  # inference-perf's; None when killed at the deadline (or unknown)
    reachable_after: bool | None = None  # the arm answered after the run (False: it died)
    error: str | None = None
    stages: tuple[StagePoint, ...] = _key(default=())
    # The engine's preemptions (vLLM) or retractions (SGLang) over the whole run, from its
    # /metrics before and after; None: not exported, not readable, or the counter was reset.
    preemptions: float | None = None
    output: OutputFigures | None = None  # None: no per-request report (an older load Job)
    prefix_cache: PrefixProbe | None = None  # None: not probed (an older load Job)
    # kvgate.sim off real time: wall seconds per engine second (0.01: the engine ran 100x faster,
    # so the client's wall-clock tok/s are 100x and TPOT 1/100 of the engine's). None: real time.
    time_scale: float | None = None

    def at(self, concurrency: int) -> StagePoint | None:
        """The stage run at `concurrency` (the first, if it ran twice)."""
        return next((s for s in self.stages if s.concurrency == concurrency), None)

    @property
    def measured(self) -> tuple[StagePoint, ...]:
        return tuple(s for s in self.stages if s.measured)


def time_scale(*arms: ArmLoad | None) -> float | None:
    """The arms' simulated time scale (the slowest clock's when they differ); None: real time."""
    scales = [a.time_scale for a in arms if a is not None and a.time_scale is not None]
    good = [s for s in scales if math.isfinite(s) and 0 < s < 1e6 and s != 1]
    return max(good) if good else None


def sim_time_note(scale: float) -> str:
    """What a load figure measured on a sped-up simulator means (first-hour issue 40, item 4)."""
    times = 1 / scale
    ratio = f"{times:,.0f}x" if times >= 10 else f"{times:.2g}x"
    return (
        f"simulated engines at {ratio} real time (KVGATE_SIM_SPEED={scale:g}): tok/s, TTFT and "
        f"TPOT are the client's wall-clock figures of the sped-up engines; in engine time tok/s "
        f"are {ratio} lower and TTFT and TPOT {ratio} higher (gains, ratios of the arms, hold)"
    )


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """Both arms' runs (started together, same stages) and the workload they ran."""

    kind: str | None = None
    verdict: LoadVerdict | None = None
    error: str | None = None
    production_concurrency: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    num_workers: int | None = None
    control: ArmLoad | None = None
    candidate: ArmLoad | None = None

    @classmethod
    def from_dict(cls, raw: object) -> LoadSummary:
        """Total: anything reads; what is not a summary reads as an empty one."""
        summary: LoadSummary = read_record(cls, raw)
        return summary

    def to_dict(self) -> dict[str, Any]:
        return dict(_write(self))

    def arm(self, name: str) -> ArmLoad | None:
        if name not in ARMS:
            raise ValueError(f"arm {name!r} is not one of {', '.join(ARMS)}")
        arm: ArmLoad | None = getattr(self, name)
        return arm


def overall(control: ArmLoad, candidate: ArmLoad) -> LoadVerdict:
    """measured: every stage of both; error: an arm broke or measured nothing; else partial."""
    arms = (control, candidate)
    if any(a.error or not a.measured for a in arms):
        return LoadVerdict.ERROR
    if all(s.measured for a in arms for s in a.stages):
        return LoadVerdict.MEASURED
    return LoadVerdict.PARTIAL


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """Where a running load Job stands, from its `kvgate.load/progress` lines (shown only, never
    evidence): the stages planned per arm, how many each arm has a report for, which arms'
    runs ended, and the concurrency of the latest stage reported."""

    started: bool = False
    stages: int | None = None
    done: tuple[tuple[str, int], ...] = ()  # (arm, stages reported) in ARMS order
    finished: tuple[str, ...] = ()
    latest_concurrency: int | None = None

    @classmethod
    def from_log(cls, text: str) -> LoadProgress:
        """Total: any text reads; lines that are not progress lines are skipped."""
        started, planned, latest = False, None, None
        seen: dict[str, set[int]] = {arm: set() for arm in ARMS}
        finished: list[str] = []
        for line in text.splitlines():
            obj = json_object(line.strip())
            if obj is None or obj.get("kind") != PROGRESS_KIND:
                continue
            event, arm = obj.get("event"), obj.get("arm")
            if event == "started":
                started = True
                stages = obj.get("stages")
                planned = len(stages) if isinstance(stages, list) else None
            elif event == "stage" and arm in seen and isinstance(obj.get("stage"), int):
                seen[arm].add(obj["stage"])
                concurrency = obj.get("concurrency")
                latest = concurrency if isinstance(concurrency, int) else latest
            elif event == "finished" and arm in seen and arm not in finished:
                finished.append(arm)
        return cls(
            started=started,
            stages=planned,
            done=tuple((arm, len(seen[arm])) for arm in ARMS),
            finished=tuple(a for a in ARMS if a in finished),
            latest_concurrency=latest,
        )

    def describe(self) -> str:
        """One line for status.message: 'stages control 2/4, candidate 1/4 (latest 32 concurrent)'."""
        if not self.started:
            return "starting inference-perf"
        of = f"/{self.stages}" if self.stages is not None else ""
        arms = ", ".join(
            f"{arm} {n}{of}" + (" done" if arm in self.finished else "") for arm, n in self.done
        )
        c = self.latest_concurrency
        latest = f" (latest {c} concurrent)" if c is not None else ""
        return f"stages {arms}{latest}"
