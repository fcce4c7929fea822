"""`/metrics` with the names, types, help texts and labels of the emulated engine (engines.md §6).

A custom collector renders the scheduler's state on each scrape; prometheus_client does
the exposition (counters gain `_total`, histograms `_bucket/_sum/_count`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kvgate.sim.engine import Histogram, Scheduler

# -- request-length histogram bounds ----------------------------------------------------------
# SGLang's default_bucket_prompt_tokens, which both its prompt and its generation histograms use:
# sglang/srt/metrics/collector.py (0.5.3) and sglang/srt/observability/metrics_collector.py
# (0.5.10), `TokenizerMetricsCollector.__init__`.
SGLANG_TOKEN_BUCKETS_OLD = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000, 15000, 20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000, 600000, 900000, 1100000]  # fmt: skip
# A longer list from 0.5.11 on (sglang/srt/observability/metrics_collector.py, 0.5.11 to 0.5.23).
SGLANG_TOKEN_BUCKETS_FROM = (0, 5, 11)
SGLANG_TOKEN_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000]  # fmt: skip
# SGLang 0.5.11 collects the token histograms whenever metrics are on and makes
# --collect-tokens-histogram a deprecated no-op (server_args.py, DeprecatedAction); 0.5.20
# drops the flag. Before 0.5.11 the histograms exist only with the flag.
SGLANG_ALWAYS_COLLECTS_TOKENS = (0, 5, 11)
SGLANG_DROPS_COLLECT_FLAG = (0, 5, 20)


def vllm_request_token_buckets(max_model_len: int) -> list[int]:
    """vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50... up to max_model_len
    (vllm/v1/metrics/loggers.py in 0.10.2-0.20.0; vllm/v1/metrics/buckets.py in 0.33.0)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


def sglang_token_buckets(version: tuple[int, ...]) -> list[int]:
    """SGLang's default bounds of `sglang:prompt_tokens_histogram` / `generation_tokens_histogram`."""
    return (
        SGLANG_TOKEN_BUCKETS if version >= SGLANG_TOKEN_BUCKETS_FROM else SGLANG_TOKEN_BUCKETS_OLD
    )


def sglang_collects_tokens(version: tuple[int, ...], collect_flag: bool) -> bool:
    """Whether SGLang (with --enable-metrics) exports its request-length histograms."""
    return collect_flag or version >= SGLANG_ALWAYS_COLLECTS_TOKENS


def _hist(name: str, doc: str, labels: dict[str, str], hist: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), buckets=hist.cumulative(), sum_value=hist.total)
    return family


def _gauge(name: str, doc: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(name: str, doc: str, labels: dict[str, str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


class VllmCollector(Collector):
    """vLLM V1 `PrometheusStatLogger` families for one engine (label `engine="0"`)."""

    def __init__(
        self,
        scheduler: Scheduler,
        model_name: str,
        version: tuple[int, ...],
        cache_config: dict[str, Any],
        show_hidden: str | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.model_name = model_name
        self.version = version
        self.cache_config = cache_config
        self.show_hidden = show_hidden

    def collect(self) -> Iterator[Metric]:
        labels = {"model_name": self.model_name, "engine": "0"}
        with self.scheduler.lock:
            s = self.scheduler.stats
            usage = self.scheduler.usage()
            yield _gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                labels,
                s.running,
            )
            yield _gauge(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                labels,
                s.waiting,
            )
            if self.version >= (0, 20):
                family = GaugeMetricFamily(
                    "vllm:num_requests_waiting_by_reason",
                    "Number of requests waiting to be processed, broken down by reason.",
                    labels=[*labels, "reason"],
                )
                family.add_metric([*labels.values(), "capacity"], s.waiting)
                family.add_metric([*labels.values(), "deferred"], 0)
                yield family
            if self.version < (0, 11):
                # 0.10.2 still registers the names deprecated in 0.9 (vllm/v1/metrics/loggers.py:211-242)
                yield _gauge(
                    "vllm:gpu_cache_usage_perc",
                    "GPU KV-cache usage. 1 means 100 percent usage."
                    "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                    labels,
                    usage,
                )
                yield _counter(
                    "vllm:gpu_prefix_cache_queries",
                    "GPU prefix cache queries, in terms of number of queried"
                    "tokens. DEPRECATED: Use vllm:prefix_cache_queries instead.",
                    labels,
                    s.prefix_queries,
                )
                yield _counter(
                    "vllm:gpu_prefix_cache_hits",
                    "GPU prefix cache hits, in terms of number of cached "
                    "tokens. DEPRECATED: Use vllm:prefix_cache_hits instead.",
                    labels,
                    s.prefix_hits,
                )
            yield _gauge(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                labels,
                usage,
            )
            yield _counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                labels,
                s.prefix_queries,
            )
            yield _counter(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                labels,
                s.prefix_hits,
            )
            yield _counter(
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                labels,
                s.preemptions,
            )
            yield _counter(
                "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, s.prompt_tokens
            )
            yield _counter(
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                labels,
                s.generation_tokens,
            )
            success = CounterMetricFamily(
                "vllm:request_success",
                "Count of successfully processed requests.",
                labels=[*labels, "finished_reason"],
            )
            reasons = ["stop", "length", "abort"] + (
                ["error", "repetition"] if self.version >= (0, 33) else []
            )
            for reason in reasons:
                success.add_metric([*labels.values(), reason], s.finished.get(reason, 0))
            yield success
            # vllm/v1/metrics/loggers.py (0.10.2-0.33.0): the same help text as the counters
            yield _hist(
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                labels,
                s.prompt_lengths,
            )
            yield _hist(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                labels,
                s.output_lengths,
            )
            yield _hist(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                labels,
                s.ttft,
            )
            if self._time_per_output_token_shown():
                yield _hist(
                    "vllm:time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
                    labels,
                    s.itl,
                )
            yield _hist(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                labels,
                s.itl,
            )
            if self.version >= (0, 11):  # not in 0.10.2's loggers.py
                yield _hist(
                    "vllm:request_time_per_output_token_seconds",
                    "Histogram of time_per_output_token_seconds per request.",
                    labels,
                    s.tpot,
                )
            yield _hist(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                labels,
                s.e2e,
            )
            yield _hist(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                labels,
                s.queue_time,
            )
        if not self.cache_config:  # KVGATE_SIM_FAULTS=no-cache-info
            return
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*self.cache_config, "engine"],
        )
        info.add_metric([*(str(v) for v in self.cache_config.values()), "0"], 1.0)
        yield info

    def _time_per_output_token_shown(self) -> bool:
        """Emitted in 0.11, hidden behind --show-hidden-metrics-for-version in 0.12-0.14, gone in 0.15."""
        if self.version < (0, 12):
            return True
        return self.version < (0, 15) and self.show_hidden is not None


class SglangCollector(Collector):
    """SGLang scheduler and tokenizer-manager families."""

    def __init__(
        self,
        scheduler: Scheduler,
        model_name: str,
        version: tuple[int, ...],
        max_total_tokens: int,
        context_len: int,
        tokens_histogram: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.model_name = model_name
        self.version = version
        self.max_total_tokens = max_total_tokens
        self.context_len = context_len
        self.tokens_histogram = tokens_histogram  # sglang_collects_tokens()

    def collect(self) -> Iterator[Metric]:
        sched = {
            "model_name": self.model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
        }
        if self.version >= (0, 5, 10):
            sched["moe_ep_rank"] = "0"
        tok = {"model_name": self.model_name}
        with self.scheduler.lock:
            s = self.scheduler.stats
            usage = s.used_tokens / self.max_total_tokens if self.max_total_tokens else 0.0
            yield _gauge(
                "sglang:num_running_reqs", "The number of running requests.", sched, s.running
            )
            yield _gauge(
                "sglang:num_used_tokens", "The number of used tokens.", sched, s.used_tokens
            )
            yield _gauge("sglang:token_usage", "The token usage.", sched, usage)
            yield _gauge(
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                sched,
                s.gen_throughput,
            )
            yield _gauge(
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                sched,
                s.waiting,
            )
            yield _gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", sched, 0.0)
            yield _gauge(
                "sglang:num_retracted_reqs",
                "The number of retracted requests.",
                sched,
                s.last_preemptions,  # the last batch's retractions only
            )
            if self.version >= (0, 5, 10):  # cumulative counter of newer releases
                yield _counter(
                    "sglang:num_retracted_requests",
                    "Total number of retracted requests.",
                    sched,
                    s.preemptions,
                )
            if self.version >= (0, 5, 6):  # sglang/srt/metrics/collector.py:300 in 0.5.6
                yield _gauge(
                    "sglang:max_total_num_tokens",
                    "Maximum total number of tokens in the KV cache pool.",
                    sched,
                    self.max_total_tokens,
                )
            if (0, 5, 9) <= self.version < (0, 5, 11):  # only 0.5.9-0.5.10 export it
                # labelnames=["page_size", "num_pages"] only (collector.py:859 in 0.5.9)
                info = GaugeMetricFamily(
                    "sglang:cache_config_info",
                    "Cache configuration information.",
                    labels=["page_size", "num_pages"],
                )
                info.add_metric(["1", str(self.max_total_tokens)], 1.0)
                yield info
            if self.version >= (0, 5, 23):
                yield _gauge(
                    "sglang:kv_available_tokens",
                    "The number of available KV cache tokens.",
                    sched,
                    self.max_total_tokens - s.used_tokens,
                )
                yield _gauge(
                    "sglang:kv_used_tokens",
                    "The number of used KV cache tokens.",
                    sched,
                    s.used_tokens,
                )
                yield _gauge("sglang:context_len", "The context length.", sched, self.context_len)
            yield _hist(
                "sglang:queue_time_seconds",
                "Histogram of queueing time in seconds.",
                sched,
                s.queue_time,
            )
            yield _counter(
                "sglang:prompt_tokens", "Number of prefill tokens processed.", tok, s.prompt_tokens
            )
            yield _counter(
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                tok,
                s.generation_tokens,
            )
            if self.tokens_histogram:  # TokenizerMetricsCollector, labels {model_name}
                yield _hist(
                    "sglang:prompt_tokens_histogram",
                    "Histogram of prompt token length.",
                    tok,
                    s.prompt_lengths,
                )
                yield _hist(
                    "sglang:generation_tokens_histogram",
                    "Histogram of generation token length.",
                    tok,
                    s.output_lengths,
                )
            if self.version >= (0, 5, 23):
                # a labelled counter, absent until the radix cache first hits; each finished
                # request adds its cached prompt tokens by source (0.5.23 sglang/srt/
                # observability/metrics_collector.py:1934-1938, :2115-2134)
                if s.prefix_hits:
                    yield _counter(
                        "sglang:cached_tokens",
                        "Number of cached prompt tokens by source (device/host/storage).",
                        {**tok, "cache_source": "device"},
                        s.prefix_hits,
                    )
            else:
                yield _counter("sglang:cached_tokens", "Number of cached prompt tokens.", tok, 0)
            yield _counter(
                "sglang:num_requests",
                "Number of requests processed.",
                tok,
                sum(s.finished.values()),
            )
            yield _counter(
                "sglang:num_aborted_requests",
                "Number of requests aborted.",
                tok,
                s.finished.get("abort", 0),
            )
            yield _hist(
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                tok,
                s.ttft,
            )
            yield _hist(
                "sglang:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                tok,
                s.itl,
            )
            yield _hist(
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                tok,
                s.e2e,
            )
            if self.version >= (0, 5, 23):
                yield _hist(
                    "sglang:request_time_per_output_token_seconds",
                    "Histogram of time per output token per request in seconds.",
                    tok,
                    s.tpot,
                )


# The simulator's one metric of its own: how its clock relates to the wall clock. Exported only
# when it differs from real time, so a client's wall-clock figures (inference-perf's tok/s and
# TPOT) can be labelled as those of a sped-up engine; the engine's own histograms are in engine
# seconds already (docs/engine-model.md).
TIME_SCALE: Final = "kvgate_sim_time_scale"


class TimeScaleCollector(Collector):
    def __init__(self, speed: float) -> None:
        self.speed = speed

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            TIME_SCALE,
            "Wall seconds per engine second (KVGATE_SIM_SPEED): 0.01 runs 100x faster than real time.",
            value=self.speed,
        )


def build_registry(collector: Collector, speed: float = 1.0) -> CollectorRegistry:
    """The engine's families plus the process and GC families every prometheus_client app has
    (and, off real time, the simulator's time scale)."""
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

    registry = CollectorRegistry(auto_describe=False)
    for default in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
        registry.register(default)
    registry.register(collector)
    if speed != 1.0:
        registry.register(TimeScaleCollector(speed))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
