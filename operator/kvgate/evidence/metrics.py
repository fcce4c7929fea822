"""What do `/metrics` and `/server_info` say, and what changed over a window?

Prometheus `/metrics` text of vLLM or SGLang -> `MetricSnapshot`; `delta` over a window.

    >>> before, after = parse_metrics(text_0, taken_at=0.0), parse_metrics(text_1, taken_at=30.0)
    >>> delta(before, after).itl.p90             # seconds, like histogram_quantile(0.9, ...)

Names differ by engine and release (reference/engines.md §6): each concept below lists the
names to try, newest first, and the snapshot records which one it found. Series that differ
only in `model_name`, `engine` or `dp_rank` are separate pools or front-ends and are added
up (usage takes the fullest); series that differ only in a TP/PP/EP rank repeat one
scheduler's numbers and are collapsed first.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, TypeGuard

from prometheus_client.parser import text_string_to_metric_families

from kvgate.errors import ParseError, SpecError
from kvgate.records.status import CacheTruth
from kvgate.vocabulary import ENGINE_NAMES, check_engine

# concept -> engine -> exposed names, preferred first.
GAUGES: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    "kv_usage": {
        "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "sglang": ("sglang:token_usage",),
    },
    "running": {
        "vllm": ("vllm:num_requests_running",),
        "sglang": ("sglang:num_running_reqs",),
    },
    "waiting": {
        "vllm": ("vllm:num_requests_waiting",),
        "sglang": ("sglang:num_queue_reqs",),
    },
    # SGLang's retraction gauge holds the last batch's retractions only, then resets.
    "retracted": {"vllm": (), "sglang": ("sglang:num_retracted_reqs",)},
    "max_total_tokens": {"vllm": (), "sglang": ("sglang:max_total_num_tokens",)},
}


COUNTERS: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    # SGLang's cumulative retractions: `num_retracted_requests_total` in newer releases (not
    # in engines.md; seen in the code index), `total_retracted_reqs` in 0.4.10.
    "preemptions": {
        "vllm": ("vllm:num_preemptions_total",),
        "sglang": ("sglang:num_retracted_requests_total", "sglang:total_retracted_reqs"),
    },
    "generation_tokens": {
        "vllm": ("vllm:generation_tokens_total",),
        "sglang": ("sglang:generation_tokens_total",),
    },
    "prompt_tokens": {
        "vllm": ("vllm:prompt_tokens_total",),
        "sglang": ("sglang:prompt_tokens_total",),
    },
    # Prefix cache tokens. vLLM: queried and hit (gpu_ names before 0.11). SGLang 0.5.23
    # (sglang/srt/observability/metrics_collector.py): a finished request's prompt tokens
    # (:1855, :2109) and those its radix cache held, by cache_source (:1934, :2115-2134; absent
    # until the first hit). The sglang:cache_hit_rate gauge (:388) is the last batch's: unused.
    "prefix_cache_queries": {
        "vllm": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "sglang": ("sglang:prompt_tokens_total",),
    },
    "prefix_cache_hits": {
        "vllm": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "sglang": ("sglang:cached_tokens_total",),
    },
}


HISTOGRAMS: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    "ttft": {
        "vllm": ("vllm:time_to_first_token_seconds",),
        "sglang": ("sglang:time_to_first_token_seconds",),
    },
    # Inter-token latency; before vLLM 0.11 / SGLang 0.4 it was called time_per_output_token.
    "itl": {
        "vllm": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "sglang": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    },
    # Per-request TPOT: (finish - first token) / (output tokens - 1).
    "tpot": {
        "vllm": ("vllm:request_time_per_output_token_seconds",),
        "sglang": ("sglang:request_time_per_output_token_seconds",),
    },
    # Finished requests' lengths in tokens (the load Job's workload shape). SGLang exports
    # them with --enable-metrics from 0.5.11, before that only with --collect-tokens-histogram.
    "prompt_lengths": {
        "vllm": ("vllm:request_prompt_tokens",),
        "sglang": ("sglang:prompt_tokens_histogram",),
    },
    "output_lengths": {
        "vllm": ("vllm:request_generation_tokens",),
        "sglang": ("sglang:generation_tokens_histogram",),
    },
}


CACHE_CONFIG: Final = {"vllm": "vllm:cache_config_info", "sglang": "sglang:cache_config_info"}


# Labels that only say which TP/PP/EP worker repeated the same scheduler numbers.
_RANK_LABELS: Final = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank"})
# Labels that name a series rather than describe the cache (dropped from cache_config).
_SERIES_LABELS: Final = _RANK_LABELS | {"engine", "model_name", "engine_type", "dp_rank"}
_QUANTILES: Final = (0.5, 0.9, 0.99)
# A /metrics body is a few hundred KiB at most; larger text is refused before parsing.
MAX_METRICS_CHARS: Final = 8 << 20
# Gauges, counters and histogram figures kvgate reads are finite and in [0, MAX_VALUE]:
# 1e18 tokens is ~30 years at 1e9 tokens/s.
MAX_VALUE: Final = 1e18


# -- histograms ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative buckets `(upper bound, count)` ascending and ending at +Inf, with sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus `histogram_quantile`: linear inside the bucket; None without observations."""
        if not 0.0 <= q <= 1.0:
            raise SpecError("quantile", f"{q} is outside [0, 1]")
        if not self.buckets or self.buckets[-1][0] != math.inf:
            return None
        total = self.buckets[-1][1]
        if total <= 0:
            return None
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for index, (upper, cumulative) in enumerate(self.buckets):
            if cumulative >= rank:
                if upper == math.inf:
                    # Above the highest finite bound: Prometheus answers with that bound.
                    return self.buckets[index - 1][0] if index > 0 else None
                if index == 0 and upper <= 0:
                    return upper
                in_bucket = cumulative - lower_count
                if in_bucket <= 0:
                    return upper
                return lower_bound + (upper - lower_bound) * (rank - lower_count) / in_bucket
            lower_bound, lower_count = upper, cumulative
        return None

    def since(self, earlier: Histogram | None) -> Histogram:
        """Observations made after `earlier`; a reset (count went down) keeps all of self."""
        if earlier is None or earlier.count > self.count:
            return self
        before = dict(earlier.buckets)
        if any(before.get(upper, 0.0) > count for upper, count in self.buckets):
            return self
        buckets = tuple((upper, count - before.get(upper, 0.0)) for upper, count in self.buckets)
        return Histogram(buckets, self.sum - earlier.sum, self.count - earlier.count)

    def to_dict(self) -> dict[str, object]:
        return {
            "buckets": [["+Inf" if up == math.inf else up, n] for up, n in self.buckets],
            "sum": self.sum,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Mean and quantiles (seconds) of one histogram over a window."""

    count: float
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, histogram: Histogram) -> LatencySummary:
        p50, p90, p99 = (histogram.quantile(q) for q in _QUANTILES)
        return cls(histogram.count, histogram.mean(), p50, p90, p99)


# -- snapshots -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricSnapshot:
    """One scrape, reduced to what kvgate reads. None: the engine does not export it."""

    engine: str
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    retracted: float | None = None
    preemptions: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    max_total_tokens: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    tpot: Histogram | None = None
    cache_config: Mapping[str, str] = field(default_factory=dict)
    # concept -> metric name found, e.g. kv_usage -> vllm:gpu_cache_usage_perc
    names: Mapping[str, str] = field(default_factory=dict)
    taken_at: float | None = None
    prompt_lengths: Histogram | None = None  # tokens per finished request's prompt
    output_lengths: Histogram | None = None  # tokens per finished request's output
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    # kvgate.sim only, off real time: wall seconds per engine second (0.01: 100x faster)
    time_scale: float | None = None

    @property
    def kv_cache_dtype(self) -> str | None:
        return self.cache_config.get("cache_dtype")

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Tokens the KV pool holds: SGLang reports it, vLLM via num_gpu_blocks x block_size."""
        if self.max_total_tokens is not None:
            return int(self.max_total_tokens)
        explicit = self.cache_config.get("kv_cache_size_tokens")
        if is_count(explicit):
            return int(explicit)
        blocks, size = self.cache_config.get("num_gpu_blocks"), self.cache_config.get("block_size")
        if is_count(blocks) and is_count(size):
            return int(blocks) * int(size)
        return None

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "taken_at": self.taken_at,
            "kv_usage": self.kv_usage,
            "running": self.running,
            "waiting": self.waiting,
            "retracted": self.retracted,
            "preemptions": self.preemptions,
            "generation_tokens": self.generation_tokens,
            "prompt_tokens": self.prompt_tokens,
            "max_total_tokens": self.max_total_tokens,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_cache_dtype": self.kv_cache_dtype,
            "ttft": self.ttft.to_dict() if self.ttft else None,
            "itl": self.itl.to_dict() if self.itl else None,
            "tpot": self.tpot.to_dict() if self.tpot else None,
            "cache_config": dict(self.cache_config),
            "names": dict(self.names),
        }


def is_count(text: str | None) -> TypeGuard[str]:
    """ASCII digits of a sane count (`'²'.isdigit()` is True and `int('²')` fails)."""
    if not text:
        return False
    return len(text) <= 18 and text.isascii() and text.isdigit()


_Labels = tuple[tuple[str, str], ...]


@dataclass
class _Samples:
    """Every sample of the exposition by name, then by its labels."""

    by_name: dict[str, dict[_Labels, float]] = field(default_factory=lambda: defaultdict(dict))

    def series(self, name: str) -> dict[_Labels, float]:
        """Series of `name` with rank labels collapsed (max: ranks repeat one value); read only
        after `_check_values`, so every value is finite."""
        collapsed: dict[_Labels, float] = {}
        for labels, value in self.by_name.get(name, {}).items():
            key = tuple(item for item in labels if item[0] not in _RANK_LABELS)
            collapsed[key] = max(collapsed.get(key, value), value)
        return collapsed


def reduce_concepts(
    samples: _Samples, table: Mapping[str, Sequence[str]], source: str
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Per concept (name -> metric names, preferred first): its value and the name read.

    The one rule for a scrape and for a Prometheus step alike: the preferred name present,
    every sample of it checked (ParseError outside [0, MAX_VALUE]), rank labels collapsed, then
    a pool's usage is the fullest series and counts add up across engines and models.
    """
    values: dict[str, float | None] = {}
    names: dict[str, str] = {}
    for concept, candidates in table.items():
        name = next((n for n in candidates if n in samples.by_name), None)
        values[concept] = None
        if name is None:
            continue
        names[concept] = name
        _check_values(samples, name, source)
        found = list(samples.series(name).values())
        if found:
            values[concept] = max(found) if concept == "kv_usage" else sum(found)
    return values, names


def samples_of(rows: Iterable[tuple[str, Mapping[str, str], float]]) -> _Samples:
    """Samples from (metric name, labels, value) rows, as a parsed exposition holds them."""
    samples = _Samples()
    for name, labels, value in rows:
        samples.by_name[name][tuple(sorted(labels.items()))] = value
    return samples


def _engine_of(samples: _Samples) -> str | None:
    counts = Counter(name.split(":", 1)[0] for name in samples.by_name)
    best = max(ENGINE_NAMES, key=lambda e: counts[e])
    return best if counts[best] else None


def _check_values(samples: _Samples, name: str, source: str) -> None:
    """Every sample of `name` kvgate reads must be a finite count or ratio."""
    for labels, value in samples.by_name.get(name, {}).items():
        if math.isfinite(value) and 0.0 <= value <= MAX_VALUE:
            continue
        shown = ",".join(f"{k}={v[:40]!r}" for k, v in labels[:4])
        raise ParseError(
            source,
            f"metric {name[:120]}{{{shown[:200]}}} has value {value:g}; kvgate reads only "
            f"finite values in [0, {MAX_VALUE:g}] (is this the engine's /metrics?)",
        )


def _bound(le: str, name: str, source: str) -> float:
    try:
        bound = float(le)
    except ValueError:
        bound = math.nan
    if math.isnan(bound) or bound == -math.inf or (abs(bound) > MAX_VALUE and bound != math.inf):
        raise ParseError(
            source, f"histogram {name[:120]} has bucket le={le[:40]!r}; use a finite bound or +Inf"
        )
    return bound


def _histogram(samples: _Samples, name: str, source: str) -> Histogram | None:
    buckets = samples.by_name.get(name + "_bucket")
    if not buckets:
        return None
    for suffix in ("_bucket", "_sum", "_count"):
        _check_values(samples, name + suffix, source)
    per_series: dict[_Labels, dict[float, float]] = defaultdict(dict)
    for labels, value in buckets.items():
        le = dict(labels).get("le")
        if le is None:
            continue
        key = tuple(item for item in labels if item[0] != "le" and item[0] not in _RANK_LABELS)
        bound = _bound(le, name, source)
        per_series[key][bound] = max(per_series[key].get(bound, 0.0), value)
    if not per_series:
        return None
    # Series with other bucket layouts can only be added on the bounds they share.
    bounds = set.intersection(*(set(b) for b in per_series.values()))
    ordered = tuple(
        (bound, sum(series[bound] for series in per_series.values())) for bound in sorted(bounds)
    )
    total = sum(samples.series(name + "_sum").values())
    count = sum(samples.series(name + "_count").values())
    return Histogram(ordered, total, count)


def _first_bad_line(text: str) -> int | None:
    """1-based number of the first line the parser rejects on its own (its errors name none)."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            return line_no
    return None


def parse_metrics(
    text: str, engine: str | None = None, *, source: str = "metrics", taken_at: float | None = None
) -> MetricSnapshot:
    """Parse Prometheus text exposition from vLLM or SGLang (`engine` None/`auto` detects it).

    Raises ParseError for empty or malformed text, or text without vLLM/SGLang metrics.
    """
    chosen = check_engine(engine)
    if len(text) > MAX_METRICS_CHARS:
        raise ParseError(
            source, f"the metrics text is larger than {MAX_METRICS_CHARS >> 20} MiB; not a /metrics"
        )
    if not text.strip():
        raise ParseError(source, "the metrics text is empty")
    if text.lstrip()[:1] in ("{", "["):  # first-hour-2 N22: /v1/models echoed 600 characters
        raise ParseError(source, "this is JSON, not Prometheus text: use the engine's /metrics")
    rows = (
        (sample.name, sample.labels, float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
    try:
        samples = samples_of(rows)
    except ValueError as exc:
        line_no = _first_bad_line(text)
        raise ParseError(source, f"not Prometheus text format: {exc}", line_no) from exc
    detected = chosen or _engine_of(samples)
    if detected is None or not any(n.startswith(detected + ":") for n in samples.by_name):
        wanted = f"{detected}:" if detected else "vllm: or sglang:"
        raise ParseError(source, f"no {wanted} metrics found; is this the engine's /metrics?")
    values, names = reduce_concepts(
        samples,
        {concept: by_engine[detected] for concept, by_engine in {**GAUGES, **COUNTERS}.items()},
        source,
    )
    histograms: dict[str, Histogram | None] = {}
    for concept, by_engine in HISTOGRAMS.items():
        name = next((n for n in by_engine[detected] if n + "_bucket" in samples.by_name), None)
        histograms[concept] = _histogram(samples, name, source) if name else None
        if name:
            names[concept] = name
    cache_config: dict[str, str] = {}
    info = samples.by_name.get(CACHE_CONFIG[detected], {})
    if info:
        names["cache_config"] = CACHE_CONFIG[detected]
        labels = dict(next(iter(info)))
        cache_config = {k: v for k, v in labels.items() if k not in _SERIES_LABELS}
    # Every concept of the tables is a MetricSnapshot field of the same name.
    concepts: dict[str, Any] = {**values, **histograms}
    return MetricSnapshot(
        engine=detected,
        **concepts,
        cache_config=cache_config,
        names=names,
        taken_at=taken_at,
        time_scale=next(iter(samples.by_name.get("kvgate_sim_time_scale", {}).values()), None),
    )


# -- windows ---------------------------------------------------------------------------------


def counter_increase(before: float | None, after: float | None) -> float | None:
    """Counter increase; a counter that went down was reset, like Prometheus' increase()."""
    if before is None or after is None:
        return None
    return after - before if after >= before else after


@dataclass(frozen=True, slots=True)
class MetricWindow:
    """What happened between two scrapes of one engine."""

    seconds: float | None
    ttft: LatencySummary | None
    itl: LatencySummary | None
    tpot: LatencySummary | None
    generation_tokens: float | None
    generation_token_rate: float | None  # tokens/s
    prompt_tokens: float | None
    preemptions: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def delta(
    before: MetricSnapshot, after: MetricSnapshot, *, seconds: float | None = None
) -> MetricWindow:
    """Histogram summaries, token rate and preemptions between two scrapes.

    `seconds` defaults to the difference of the snapshots' `taken_at`; without either the
    rate is None.
    """
    if before.engine != after.engine:
        raise SpecError(
            "after",
            f"scrapes of different engines ({before.engine}, {after.engine}) cannot be compared",
        )
    if seconds is None and before.taken_at is not None and after.taken_at is not None:
        seconds = after.taken_at - before.taken_at
    if seconds is not None and seconds < 0:
        raise SpecError("seconds", f"{seconds:g} is negative; pass the earlier scrape first")

    def window(h_before: Histogram | None, h_after: Histogram | None) -> LatencySummary | None:
        return LatencySummary.of(h_after.since(h_before)) if h_after is not None else None

    tokens = counter_increase(before.generation_tokens, after.generation_tokens)
    rate = tokens / seconds if tokens is not None and seconds else None
    return MetricWindow(
        seconds=seconds,
        ttft=window(before.ttft, after.ttft),
        itl=window(before.itl, after.itl),
        tpot=window(before.tpot, after.tpot),
        generation_tokens=tokens,
        generation_token_rate=rate,
        prompt_tokens=counter_increase(before.prompt_tokens, after.prompt_tokens),
        preemptions=counter_increase(before.preemptions, after.preemptions),
    )


# The MetricSnapshot fields pool_pressure reads: what an operator keeps of a sample between scrapes.
POOL_SAMPLE_FIELDS: Final = ("engine", "kv_usage", "running", "waiting", "retracted", "preemptions")


def snapshot_from_pool_sample(sample: Mapping[str, object]) -> MetricSnapshot:
    """A MetricSnapshot rebuilt from its POOL_SAMPLE_FIELDS; latency and token fields are unknown."""
    # The sample is the pool fields kept between scrapes: each value has its field's type,
    # and a field left out was None. Taken as it is, not checked again.
    values: dict[str, Any] = {k: sample.get(k) for k in POOL_SAMPLE_FIELDS}
    return MetricSnapshot(**values)


# -- SGLang's server info: the KV dtype its /metrics do not carry --------------------------------

# SGLang's /metrics name no KV dtype (no metric or label in sglang/srt/metrics/ 0.4.10-0.5.23),
# but its server info returns the server's args, `kv_cache_dtype` among them: the dtype the
# running server process was configured with (0.4.10.post2-0.5.3 GET /get_server_info:
# `dataclasses.asdict(tokenizer_manager.server_args)` + scheduler_info, http_server.py:317 /
# :477; 0.5.23 GET /server_info: `server_args.resolved_dict()` via build_server_info,
# sglang/srt/utils/common.py:3584, http_server.py:863). /server_info exists from 0.5.6, where
# /get_server_info became a deprecated alias that logs a warning per call: new path first.
SERVER_INFO_PATHS: Final = ("/server_info", "/get_server_info")


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What kvgate reads of SGLang's server info: the KV dtype and the scheduler's pool size
    (`max_total_num_tokens` of scheduler_info, sglang/srt/managers/scheduler.py:2859 in 0.5.3;
    every release 0.4.6-0.5.23 puts it there, while /metrics export it only from 0.5.6)."""

    kv_cache_dtype: str
    max_total_num_tokens: int | None

    def to_status(self) -> dict[str, object]:
        out: dict[str, object] = {"kvCacheDtype": self.kv_cache_dtype}
        if self.max_total_num_tokens is not None:
            out["maxTotalNumTokens"] = self.max_total_num_tokens
        return out

    @classmethod
    def from_status(cls, raw: object) -> ServerInfo | None:
        """Back from `to_status` (None for an absent or unreadable record)."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("kvCacheDtype"), str):
            return None
        return cls(str(raw["kvCacheDtype"]), _positive_int(raw.get("maxTotalNumTokens")))


def parse_server_info(body: str, source: str = "server_info") -> ServerInfo:
    """An SGLang server info body; ParseError naming what is wrong."""
    try:
        info = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ParseError(source, f"not JSON ({exc.msg})") from exc
    except ValueError as exc:  # e.g. a number too long to convert
        raise ParseError(source, f"not JSON ({str(exc)[:100]})") from exc
    if not isinstance(info, dict):
        raise ParseError(source, f"a JSON {type(info).__name__}, not an object")
    dtype = info.get("kv_cache_dtype")
    if not isinstance(dtype, str) or not dtype.strip():
        raise ParseError(source, "no string kv_cache_dtype (not an SGLang server?)")
    return ServerInfo(dtype.strip(), _positive_int(info.get("max_total_num_tokens")))


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


# What the cross-check reads of a scrape: kept in status per arm, so the check is pure.
CACHE_TRUTH_KEYS: Final = ("cache_dtype", "num_gpu_blocks", "block_size", "kv_cache_size_tokens")


def cache_truth(snapshot: MetricSnapshot) -> dict[str, object]:
    """The part of a scrape `cross_check_log` compares, as plain JSON (absent keys left out)."""
    config = {
        k: str(snapshot.cache_config[k]) for k in CACHE_TRUTH_KEYS if k in snapshot.cache_config
    }
    truth: dict[str, object] = {"engine": snapshot.engine, "cacheConfig": config}
    if snapshot.max_total_tokens is not None:
        truth["maxTotalTokens"] = int(snapshot.max_total_tokens)
    return truth


def snapshot_from_cache_truth(truth: CacheTruth) -> MetricSnapshot:
    """A MetricSnapshot rebuilt from `cache_truth` as status keeps it; the rest is unknown."""
    config, total = truth.cache_config, truth.max_total_tokens
    return MetricSnapshot(
        engine=truth.engine or "",
        max_total_tokens=float(total) if total is not None and total > 0 else None,
        cache_config={str(k): str(v) for k, v in config.items() if k in CACHE_TRUTH_KEYS},
    )
