"""adapters/prometheus: the query_range answer parser against hostile JSON, and the reduction
of series to pool snapshots (the same aggregation as a parsed /metrics)."""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any

import httpx
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from prometheus_client.parser import text_string_to_metric_families

from kvgate.adapters import prometheus
from kvgate.adapters.prometheus import (
    Series,
    parse_matrix,
    pool_history,
    pool_query,
    snapshots_from_series,
)
from kvgate.controller.sources import pool_record
from kvgate.errors import PrometheusError
from kvgate.evidence.metrics import parse_metrics
from kvgate.evidence.pool import pool_pressure
from kvgate.judge.throughput import RequestLengths, production_lengths
from kvgate.records.codec import write
from kvgate.records.status import PoolSample, RolloutStatus

FUZZ = settings(
    max_examples=150,
    deadline=10_000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "0x10", "1_000", " 1", ""]),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=25,
)
# Near-valid answers: the right envelope with hostile parts, so the parser is reached deeply.
points = st.lists(st.one_of(st.tuples(scalars, scalars).map(list), json_values), max_size=4)
series_items = st.one_of(
    st.fixed_dictionaries(
        {"metric": st.one_of(st.dictionaries(st.text(max_size=8), scalars, max_size=3), json_values),
         "values": st.one_of(points, json_values)}
    ),
    json_values,
)  # fmt: skip
answers = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "status": st.sampled_from(["success", "error", None]),
            "data": st.one_of(
                json_values,
                st.fixed_dictionaries(
                    {
                        "resultType": st.sampled_from(["matrix", "vector", "scalar", 3]),
                        "result": st.one_of(st.lists(series_items, max_size=4), json_values),
                    }
                ),
            ),
        }
    ),
)


def _stored_lengths(status: object) -> RequestLengths:
    """The production lengths of a rollout's status as stored."""
    return production_lengths(RolloutStatus.from_dict(status).preflight)


@FUZZ
@given(answers)
def test_any_json_is_series_or_one_prometheus_error(doc: Any) -> None:
    body = json.dumps(doc, allow_nan=True)
    try:
        found = parse_matrix(body, source="http://prom:9090")
    except PrometheusError as exc:
        text = str(exc)
        assert text.startswith("http://prom:9090: ") and "\n" not in text and len(text) < 400
        return
    # Accepted: typed series, finite times, float values, string labels only.
    for s in found:
        assert isinstance(s, Series)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items())
        for ts, value in s.points:
            assert math.isfinite(ts) and isinstance(value, float)
        assert list(s.points) == sorted(s.points)
    # and reducing them to snapshots either works or is the same one error
    with contextlib.suppress(PrometheusError):
        snapshots_from_series("vllm", {"web-0": "10.0.0.5"}, found)


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_are_series_or_one_prometheus_error(raw: bytes) -> None:
    with contextlib.suppress(PrometheusError):
        parse_matrix(raw.decode("utf-8", errors="replace"))


def test_deep_nesting_and_too_many_series_are_refused() -> None:
    with pytest.raises(PrometheusError, match="not JSON"):
        parse_matrix("[" * 100_000 + "]" * 100_000)
    many = [{"metric": {}, "values": []}] * (prometheus.MAX_SERIES + 1)
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": many}})
    with pytest.raises(PrometheusError, match="more than 5000"):
        parse_matrix(body)


def _series(name: str, instance: str, values: list[float], **labels: str) -> Series:
    return Series(
        {"__name__": name, "instance": instance, **labels},
        tuple((float(t), v) for t, v in enumerate(values)),
    )


def test_series_reduce_like_a_parsed_scrape() -> None:
    """TP ranks collapse (max), engines/models add up, usage is the fullest; the same numbers a
    /metrics with those series gives parse_metrics."""
    found = [
        _series("vllm:kv_cache_usage_perc", "10.0.0.5:8000", [0.5], engine="0", tp_rank="0"),
        _series("vllm:kv_cache_usage_perc", "10.0.0.5:8000", [0.5], engine="0", tp_rank="1"),
        _series("vllm:kv_cache_usage_perc", "10.0.0.5:8000", [0.9], engine="1"),
        _series("vllm:num_requests_waiting", "10.0.0.5:8000", [3.0], engine="0", tp_rank="0"),
        _series("vllm:num_requests_waiting", "10.0.0.5:8000", [3.0], engine="0", tp_rank="1"),
        _series("vllm:num_requests_waiting", "10.0.0.5:8000", [2.0], engine="1"),
        # the older name is ignored when the newer one is there, as parse_metrics does
        _series("vllm:gpu_cache_usage_perc", "10.0.0.5:8000", [0.1], engine="0"),
        # another pod's series
        _series("vllm:num_requests_waiting", "10.0.0.6:8000", [40.0], engine="0"),
    ]
    snap = snapshots_from_series("vllm", {"web-0": "10.0.0.5"}, found)["web-0"][0]
    text = "\n".join(
        [
            'vllm:kv_cache_usage_perc{engine="0",tp_rank="0"} 0.5',
            'vllm:kv_cache_usage_perc{engine="0",tp_rank="1"} 0.5',
            'vllm:kv_cache_usage_perc{engine="1"} 0.9',
            'vllm:num_requests_waiting{engine="0",tp_rank="0"} 3',
            'vllm:num_requests_waiting{engine="0",tp_rank="1"} 3',
            'vllm:num_requests_waiting{engine="1"} 2',
            'vllm:gpu_cache_usage_perc{engine="0"} 0.1',
            "",
        ]
    )
    scraped = parse_metrics(text, "vllm")
    assert (snap.kv_usage, snap.waiting) == (scraped.kv_usage, scraped.waiting) == (0.9, 5.0)
    assert snap.names["kv_usage"] == scraped.names["kv_usage"] == "vllm:kv_cache_usage_perc"


def test_a_history_judges_like_scrapes_and_an_unscraped_pod_is_unknown() -> None:
    usage = [0.95, 0.97, 0.99, 0.96]
    found = [
        _series("sglang:token_usage", "[fd00::5]:30000", usage),
        _series("sglang:num_queue_reqs", "[fd00::5]:30000", [4, 6, 5, 7]),
        _series("sglang:num_running_reqs", "[fd00::5]:30000", [30, 30, 30, 30]),
    ]
    history = snapshots_from_series("sglang", {"web-0": "fd00::5", "web-1": "fd00::6"}, found)
    assert [s.kv_usage for s in history["web-0"]] == usage
    assert pool_pressure(history["web-0"]).pressured is True
    assert history["web-1"] == [] and pool_pressure(history["web-1"]).pressured is None


def test_the_query_selects_only_these_pods_and_the_engines_names() -> None:
    query = pool_query("vllm", ["10.0.0.5", "10.0.0.50"])
    assert 'instance=~"(10\\\\.0\\\\.0\\\\.5|10\\\\.0\\\\.0\\\\.50)(:[0-9]+)?"' in query
    assert "vllm:kv_cache_usage_perc" in query and "sglang" not in query
    assert "vllm:time_to_first_token_seconds_sum" in query


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, 2e18])
def test_a_value_no_engine_exports_is_one_prometheus_error_naming_the_metric(value: float) -> None:
    """The shared reduction's bound check (metrics.reduce_concepts) speaks as Prometheus here:
    the caller's 'unknown', never a verdict and never an InputError from the parser."""
    found = [_series("vllm:num_requests_waiting", "10.0.0.5:8000", [value], engine="0")]
    with pytest.raises(PrometheusError) as caught:
        snapshots_from_series("vllm", {"web-0": "10.0.0.5"}, found, source="http://prom:9090")
    text = str(caught.value)
    assert text.startswith("http://prom:9090: ") and "vllm:num_requests_waiting" in text
    assert "\n" not in text


# -- production's request lengths (issue 21): the same totals from Prometheus as from a scrape --

# One vLLM pod with two engines (their series add up), 40 requests of 1,800 / 400 tokens on average
VLLM_LENGTHS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine="0",le="2000.0",model_name="m"} 30
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="m"} 30
vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 54000
vllm:request_prompt_tokens_count{engine="0",model_name="m"} 30
vllm:request_prompt_tokens_bucket{engine="1",le="2000.0",model_name="m"} 10
vllm:request_prompt_tokens_bucket{engine="1",le="+Inf",model_name="m"} 10
vllm:request_prompt_tokens_sum{engine="1",model_name="m"} 18000
vllm:request_prompt_tokens_count{engine="1",model_name="m"} 10
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="500.0",model_name="m"} 30
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="m"} 30
vllm:request_generation_tokens_sum{engine="0",model_name="m"} 12000
vllm:request_generation_tokens_count{engine="0",model_name="m"} 30
vllm:request_generation_tokens_bucket{engine="1",le="500.0",model_name="m"} 10
vllm:request_generation_tokens_bucket{engine="1",le="+Inf",model_name="m"} 10
vllm:request_generation_tokens_sum{engine="1",model_name="m"} 4000
vllm:request_generation_tokens_count{engine="1",model_name="m"} 10
"""

# One SGLang pod at TP 2: both ranks repeat the scheduler's totals (collapsed, not added)
SGLANG_LENGTHS = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 2
sglang:num_running_reqs{model_name="m",tp_rank="1"} 2
# TYPE sglang:prompt_tokens_histogram histogram
sglang:prompt_tokens_histogram_bucket{le="2000.0",model_name="m",tp_rank="0"} 40
sglang:prompt_tokens_histogram_bucket{le="+Inf",model_name="m",tp_rank="0"} 40
sglang:prompt_tokens_histogram_sum{model_name="m",tp_rank="0"} 72000
sglang:prompt_tokens_histogram_count{model_name="m",tp_rank="0"} 40
sglang:prompt_tokens_histogram_bucket{le="2000.0",model_name="m",tp_rank="1"} 40
sglang:prompt_tokens_histogram_bucket{le="+Inf",model_name="m",tp_rank="1"} 40
sglang:prompt_tokens_histogram_sum{model_name="m",tp_rank="1"} 72000
sglang:prompt_tokens_histogram_count{model_name="m",tp_rank="1"} 40
# TYPE sglang:generation_tokens_histogram histogram
sglang:generation_tokens_histogram_bucket{le="500.0",model_name="m",tp_rank="0"} 40
sglang:generation_tokens_histogram_bucket{le="+Inf",model_name="m",tp_rank="0"} 40
sglang:generation_tokens_histogram_sum{model_name="m",tp_rank="0"} 16000
sglang:generation_tokens_histogram_count{model_name="m",tp_rank="0"} 40
sglang:generation_tokens_histogram_bucket{le="500.0",model_name="m",tp_rank="1"} 40
sglang:generation_tokens_histogram_bucket{le="+Inf",model_name="m",tp_rank="1"} 40
sglang:generation_tokens_histogram_sum{model_name="m",tp_rank="1"} 16000
sglang:generation_tokens_histogram_count{model_name="m",tp_rank="1"} 40
"""

LENGTH_NAMES = {
    "vllm": ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"),
    "sglang": ("sglang:prompt_tokens_histogram", "sglang:generation_tokens_histogram"),
}


def _selector_label(query: str, label: str) -> re.Pattern[str]:
    """A `label=~"regex"` matcher of the selector, its PromQL string escapes undone."""
    found = re.search(label + r'=~"((?:[^"\\]|\\.)*)"', query)
    assert found is not None, (label, query)
    return re.compile(found.group(1).replace("\\\\", "\\"))


def _prometheus_of(text: str, instance: str) -> httpx.Client:
    """A Prometheus that scraped one pod serving `text` at every step: it answers a range query
    with the series whose name and instance the query's selector matches, as Prometheus does."""
    scraped = [
        (sample.name, {**sample.labels, "instance": instance, "job": "engines"}, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]

    def answer(request: httpx.Request) -> httpx.Response:
        params = request.url.params
        query = params["query"]
        names, instances = _selector_label(query, "__name__"), _selector_label(query, "instance")
        start, end, step = (float(params[k]) for k in ("start", "end", "step"))
        times = [start + i * step for i in range(int((end - start) / step) + 1)]
        result = [
            {"metric": {"__name__": name, **labels}, "values": [[t, str(value)] for t in times]}
            for name, labels, value in scraped
            if names.fullmatch(name) and instances.fullmatch(labels["instance"])
        ]
        matrix = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return httpx.Response(200, json=matrix)

    return httpx.Client(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_query_asks_for_the_request_length_totals(engine: str) -> None:
    query = pool_query(engine, ["10.0.0.5"])
    for family in LENGTH_NAMES[engine]:
        assert f"{family}_sum" in query and f"{family}_count" in query
    assert "_bucket" not in query  # status keeps totals only: no bucket series are fetched


@pytest.mark.parametrize(("engine", "text"), [("vllm", VLLM_LENGTHS), ("sglang", SGLANG_LENGTHS)])
def test_prometheus_history_gives_the_load_the_lengths_a_scrape_gives(
    engine: str, text: str
) -> None:
    # GIVEN a production pod whose /metrics hold 40 finished requests of 1,800 / 400 tokens on
    # average, and a Prometheus that scraped it
    client = _prometheus_of(text, instance="10.0.0.5:8000")
    # WHEN preflight reads the pod's history from Prometheus, and (elsewhere) scrapes it
    history = pool_history(
        "http://prom:9090",
        engine,
        {"web-0": "10.0.0.5"},
        window_s=2,
        step_s=1,
        now=100.0,
        client=client,
    )["web-0"]
    scraped = parse_metrics(text, engine)
    # THEN every step carries the length totals the scrape has, named as the scrape names them
    assert len(history) == 3
    for snap in history:
        for concept in ("prompt_lengths", "output_lengths"):
            from_prometheus, from_scrape = getattr(snap, concept), getattr(scraped, concept)
            assert from_prometheus is not None and from_scrape is not None
            assert (from_prometheus.sum, from_prometheus.count) == (
                from_scrape.sum,
                from_scrape.count,
            )
            assert snap.names[concept] == scraped.names[concept]
    assert snap.prompt_lengths is not None and snap.prompt_lengths.count == 40
    # and status keeps the same record of both, so the load Job runs the same lengths
    kept = _lengths_record(pool_record(history[-1]))
    assert kept == _lengths_record(pool_record(scraped)) and len(kept) == 4
    via_prometheus = _stored_lengths(
        {
            "preflight": {
                "source": "prometheus",
                "samples": {"web-0": [write(pool_record(s)) for s in history]},
            }
        }
    )
    via_scrapes = _stored_lengths(
        {"preflight": {"samples": {"web-0": [write(pool_record(scraped))]}}}
    )
    assert _shape(via_prometheus) == _shape(via_scrapes) == (1800, 400, True)
    # each saying where the lengths were read
    assert via_prometheus.message.startswith(
        "production's request lengths from Prometheus over 40 requests: prompt mean 1800"
    )
    assert via_scrapes.message.startswith(
        "production's request lengths from the pods' /metrics over 40 requests"
    )


def _lengths_record(sample: PoolSample) -> dict[str, Any]:
    """The request-length totals a kept sample holds (those it has)."""
    fields = ("prompt_len_sum", "prompt_len_count", "output_len_sum", "output_len_count")
    return {k: v for k in fields if (v := getattr(sample, k)) is not None}


def _shape(lengths: RequestLengths) -> tuple[int, int, bool]:
    return lengths.prompt_tokens, lengths.output_tokens, lengths.derived


def test_a_pod_without_length_series_in_prometheus_runs_the_fixed_lengths_saying_so() -> None:
    # GIVEN an SGLang before 0.5.11 without --collect-tokens-histogram: no length series
    text = SGLANG_LENGTHS.split("# TYPE sglang:prompt_tokens_histogram")[0]
    history = pool_history(
        "http://prom:9090",
        "sglang",
        {"web-0": "10.0.0.5"},
        window_s=2,
        step_s=1,
        now=100.0,
        client=_prometheus_of(text, instance="10.0.0.5:30000"),
    )["web-0"]
    assert history and all(s.prompt_lengths is None and s.output_lengths is None for s in history)
    assert "prompt_lengths" not in history[-1].names
    records = [pool_record(s) for s in history]
    assert not any(_lengths_record(r) for r in records)
    lengths = _stored_lengths(
        {"preflight": {"source": "prometheus", "samples": {"web-0": [write(r) for r in records]}}}
    )
    assert not lengths.derived
    assert lengths.message == (
        "production's request lengths unread from Prometheus (no prompt-length histogram): the "
        "load runs the fixed 512 prompt / 128 output tokens"
    )
