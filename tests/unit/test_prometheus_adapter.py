"""adapters/prometheus: the query_range answer parser against hostile JSON, and the reduction
of series to pool snapshots (the same aggregation as a parsed /metrics)."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from kvgate.adapters import prometheus
from kvgate.adapters.prometheus import Series, parse_matrix, pool_query, snapshots_from_series
from kvgate.errors import PrometheusError
from kvgate.metrics import parse_metrics
from kvgate.pool import pool_pressure

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
