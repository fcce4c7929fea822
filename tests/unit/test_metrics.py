"""kvgate.evidence.metrics: /metrics of vLLM and SGLang across renames, windows and pool pressure."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvgate.errors import ParseError, SpecError, UnsupportedError
from kvgate.evidence.metrics import (
    Histogram,
    MetricSnapshot,
    delta,
    parse_metrics,
)
from kvgate.evidence.pool import pool_pressure, pool_pressure_across_replicas

METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics"


def read(name: str) -> str:
    return (METRICS / name).read_text()


# -- fixtures --------------------------------------------------------------------------------

# file -> engine, kv_usage, running, waiting, preemptions, retracted, usage metric, itl metric,
#         kv pool tokens, cache dtype
FIXTURES: dict[str, tuple[object, ...]] = {
    "vllm-0.10-v0-old-names.txt": (
        "vllm", 0.97, 48.0, 12.0, 31.0, None,
        "vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds", 57808, "fp8",
    ),
    "vllm-0.11.txt": (
        "vllm", 0.42, 17.0, 0.0, 0.0, None,
        "vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds", 57808, "fp8",
    ),
    "vllm-0.33-dp2.txt": (
        "vllm", 0.95, 124.0, 12.0, 7.0, None,
        "vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds", 57808, "fp8",
    ),
    "sglang-0.5.3-tp2.txt": (
        "sglang", 0.93, 52.0, 7.0, None, 1.0,
        "sglang:token_usage", "sglang:inter_token_latency_seconds", None, None,
    ),
    "sglang-0.5.10.txt": (
        "sglang", 0.35, 12.0, 0.0, None, 0.0,
        "sglang:token_usage", "sglang:inter_token_latency_seconds", 436906, None,
    ),
}  # fmt: skip


def test_every_fixture_is_in_the_table() -> None:
    assert sorted(p.name for p in METRICS.glob("*.txt")) == sorted(FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture(name: str) -> None:
    engine, usage, running, waiting, preempt, retracted, usage_name, itl_name, pool, dtype = (
        FIXTURES[name]
    )
    snap = parse_metrics(read(name))
    assert (snap.engine, snap.kv_usage, snap.running, snap.waiting) == (
        engine,
        usage,
        running,
        waiting,
    )
    assert (snap.preemptions, snap.retracted) == (preempt, retracted)
    assert snap.names["kv_usage"] == usage_name
    assert snap.names["itl"] == itl_name
    assert snap.kv_capacity_tokens == pool
    assert snap.kv_cache_dtype == dtype
    assert snap.ttft is not None and snap.itl is not None
    assert snap.ttft.buckets[-1] == (math.inf, snap.ttft.count)


def test_vllm_engines_add_up_and_usage_is_the_fullest() -> None:
    snap = parse_metrics(read("vllm-0.33-dp2.txt"))
    # engine 0 and 1 are separate pools: 64 + 60 running, usage max(0.95, 0.88)
    assert (snap.running, snap.waiting, snap.kv_usage) == (124.0, 12.0, 0.95)
    assert snap.generation_tokens == 2 * 96500.0
    assert snap.itl is not None and snap.itl.count == 4000


def test_sglang_tp_ranks_repeat_one_scheduler() -> None:
    snap = parse_metrics(read("sglang-0.5.3-tp2.txt"))
    assert (snap.running, snap.waiting, snap.retracted) == (52.0, 7.0, 1.0)


def test_cache_config_keeps_cache_labels_only() -> None:
    vllm = parse_metrics(read("vllm-0.33-dp2.txt")).cache_config
    assert vllm["kv_cache_size_tokens"] == "57808" and "engine" not in vllm
    sglang = parse_metrics(read("sglang-0.5.10.txt")).cache_config
    assert sglang == {"num_pages": "436906", "page_size": "1"}


VLLM_BOTH_USAGES = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


def test_new_name_wins_over_deprecated_one() -> None:
    snap = parse_metrics(VLLM_BOTH_USAGES)
    assert (snap.kv_usage, snap.names["kv_usage"]) == (0.5, "vllm:kv_cache_usage_perc")


def test_old_sglang_tpot_name() -> None:
    text = """\
# TYPE sglang:time_per_output_token_seconds histogram
sglang:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 3.0
sglang:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
sglang:time_per_output_token_seconds_sum{model_name="m"} 0.5
sglang:time_per_output_token_seconds_count{model_name="m"} 4.0
"""
    snap = parse_metrics(text)
    assert snap.names["itl"] == "sglang:time_per_output_token_seconds"
    assert snap.itl == Histogram(((0.1, 3.0), (math.inf, 4.0)), 0.5, 4.0)


def test_sglang_cumulative_retractions() -> None:
    text = """\
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.97
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{model_name="m",pid="41",tp_rank="0"} 0.0
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 48.0
"""
    snap = parse_metrics(text)
    assert (snap.preemptions, snap.retracted) == (48.0, 0.0)
    assert snap.names["preemptions"] == "sglang:num_retracted_requests_total"


def test_metrics_without_type_lines() -> None:
    snap = parse_metrics(
        'vllm:num_requests_waiting{model_name="a"} 2\nvllm:num_requests_waiting{model_name="b"} 3\n'
    )
    assert snap.waiting == 5.0
    assert snap.kv_usage is None and "kv_usage" not in snap.names


def test_nan_gauge_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match=r"vllm:kv_cache_usage_perc.* has value nan"):
        parse_metrics('vllm:kv_cache_usage_perc{model_name="a"} NaN\n')


@pytest.mark.parametrize(
    ("text", "engine", "message"),
    [
        ("", None, "metrics: the metrics text is empty"),
        ("  \n", None, "metrics: the metrics text is empty"),
        (
            "# HELP x\nvllm:num_requests_running 1\nvllm:num_requests_waiting abc\n",
            None,
            "metrics:3: not Prometheus text format: could not convert string to float: 'abc'",
        ),
        (
            'http_requests_total{handler="/v1/completions"} 3\n',
            None,
            "metrics: no vllm: or sglang: metrics found; is this the engine's /metrics?",
        ),
        (
            VLLM_BOTH_USAGES,
            "sglang",
            "metrics: no sglang: metrics found; is this the engine's /metrics?",
        ),
    ],
)
def test_bad_text(text: str, engine: str | None, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_metrics(text, engine)
    assert str(info.value) == message


def test_bad_line_number() -> None:
    with pytest.raises(ParseError) as info:
        parse_metrics('vllm:a 1\n\nvllm:b{x="1} 2\n', source="http://pod:8000/metrics")
    assert (info.value.source, info.value.line_no) == ("http://pod:8000/metrics", 3)


def test_unknown_engine() -> None:
    with pytest.raises(UnsupportedError) as info:
        parse_metrics(VLLM_BOTH_USAGES, "tgi")
    assert str(info.value) == "engine 'tgi' is not known; use vllm, sglang or auto"


# -- histograms ------------------------------------------------------------------------------

H = Histogram(((0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (math.inf, 40.0)), 6.0, 40.0)


@pytest.mark.parametrize(
    ("histogram", "q", "expected"),
    [
        # rank 20 falls in (0.1, 0.2] holding 20 observations after 10: 0.1 + 0.1 * 10/20
        (H, 0.5, 0.15),
        (H, 0.25, 0.1),  # rank 10 = all of the first bucket: its upper bound
        (H, 0.0, 0.0),  # start of the first bucket
        (H, 1.0, 0.4),
        (H, 0.9, 0.2 + 0.2 * (36 - 30) / 10),
        # beyond the last finite bound Prometheus answers with that bound
        (Histogram(((0.1, 10.0), (math.inf, 20.0)), 3.0, 20.0), 0.9, 0.1),
        (Histogram(((-1.0, 5.0), (math.inf, 5.0)), 0.0, 5.0), 0.5, -1.0),
        (Histogram(((0.1, 0.0), (math.inf, 0.0)), 0.0, 0.0), 0.5, None),
        (Histogram(((0.1, 1.0),), 0.1, 1.0), 0.5, None),  # no +Inf bucket
    ],
)
def test_quantile(histogram: Histogram, q: float, expected: float | None) -> None:
    got = histogram.quantile(q)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("q", [-0.1, 1.5])
def test_quantile_out_of_range(q: float) -> None:
    with pytest.raises(SpecError) as info:
        H.quantile(q)
    assert str(info.value) == f"quantile: {q} is outside [0, 1]"


def test_mean() -> None:
    assert H.mean() == 6.0 / 40.0
    assert Histogram(((math.inf, 0.0),), 0.0, 0.0).mean() is None


def test_since_subtracts_bucket_by_bucket() -> None:
    earlier = Histogram(((0.1, 4.0), (0.2, 10.0), (0.4, 10.0), (math.inf, 10.0)), 1.0, 10.0)
    window = H.since(earlier)
    assert window == Histogram(((0.1, 6.0), (0.2, 20.0), (0.4, 30.0), (math.inf, 30.0)), 5.0, 30.0)


def test_since_after_a_reset_keeps_the_new_counts() -> None:
    restarted = Histogram(((0.1, 1.0), (math.inf, 2.0)), 0.3, 2.0)
    assert restarted.since(H) == restarted
    assert H.since(None) == H


# -- windows ---------------------------------------------------------------------------------


def vllm_text(
    tokens: float, preemptions: float, itl: tuple[float, float, float], itl_sum: float
) -> str:
    le_005, le_01, total = itl
    return f"""\
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preemptions}
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.05",model_name="m"}} {le_005}
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {le_01}
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {total}
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {itl_sum}
vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {total}
"""


def test_delta_between_two_scrapes() -> None:
    before = parse_metrics(vllm_text(1000, 2, (10, 20, 20), 1.0), taken_at=100.0)
    after = parse_metrics(vllm_text(4000, 5, (40, 80, 100), 6.0), taken_at=130.0)
    window = delta(before, after)
    assert window.seconds == 30.0
    assert (window.generation_tokens, window.generation_token_rate) == (3000, 100.0)
    assert window.preemptions == 3
    assert window.itl is not None
    # 80 new observations: 30 <= 0.05, 30 in (0.05, 0.1], 20 above 0.1
    assert window.itl.count == 80
    assert window.itl.mean == pytest.approx(5.0 / 80)
    assert window.itl.p50 == pytest.approx(0.05 + 0.05 * (40 - 30) / 30)
    assert window.itl.p90 == 0.1  # rank 72 is in the +Inf bucket
    assert window.ttft is None and window.prompt_tokens is None


def test_delta_across_a_restart() -> None:
    before = parse_metrics(vllm_text(9000, 9, (10, 20, 20), 1.0))
    after = parse_metrics(vllm_text(500, 1, (5, 5, 5), 0.1))
    window = delta(before, after, seconds=10.0)
    assert (window.generation_tokens, window.generation_token_rate, window.preemptions) == (
        500,
        50.0,
        1,
    )
    assert window.itl is not None and window.itl.count == 5


def test_delta_without_times_has_no_rate() -> None:
    snap = parse_metrics(vllm_text(1, 0, (0, 0, 0), 0))
    window = delta(snap, snap)
    assert (window.seconds, window.generation_token_rate, window.generation_tokens) == (
        None,
        None,
        0,
    )


def test_delta_rejects_reversed_or_mixed_scrapes() -> None:
    early = parse_metrics(vllm_text(1, 0, (0, 0, 0), 0), taken_at=10.0)
    late = parse_metrics(vllm_text(2, 0, (0, 0, 0), 0), taken_at=5.0)
    with pytest.raises(SpecError) as info:
        delta(early, late)
    assert str(info.value) == "seconds: -5 is negative; pass the earlier scrape first"
    with pytest.raises(SpecError) as info:
        delta(early, parse_metrics(read("sglang-0.5.10.txt")))
    assert (
        str(info.value) == "after: scrapes of different engines (vllm, sglang) cannot be compared"
    )


def test_window_to_dict() -> None:
    before = parse_metrics(vllm_text(1000, 2, (10, 20, 20), 1.0), taken_at=0.0)
    after = parse_metrics(vllm_text(4000, 5, (40, 80, 100), 6.0), taken_at=30.0)
    data = delta(before, after).to_dict()
    assert set(data) == {
        "seconds",
        "ttft",
        "itl",
        "tpot",
        "generation_tokens",
        "generation_token_rate",
        "prompt_tokens",
        "preemptions",
    }
    assert data["itl"] == {
        "count": 80.0,
        "mean": 5.0 / 80,
        "p50": pytest.approx(0.0667, abs=1e-4),
        "p90": 0.1,
        "p99": 0.1,
    }


# -- pool pressure ---------------------------------------------------------------------------


def snap(
    usage: float | None,
    waiting: float | None = 0.0,
    running: float | None = 10.0,
    preemptions: float | None = None,
    retracted: float | None = None,
    engine: str = "vllm",
) -> MetricSnapshot:
    return MetricSnapshot(
        engine=engine,
        kv_usage=usage,
        running=running,
        waiting=waiting,
        retracted=retracted,
        preemptions=preemptions,
        generation_tokens=None,
        prompt_tokens=None,
        max_total_tokens=None,
        ttft=None,
        itl=None,
        tpot=None,
        cache_config={},
        names={},
    )


# name -> samples, expected pressured, expected pressured samples
PRESSURE_CASES: dict[str, tuple[list[MetricSnapshot], bool | None, int]] = {
    "full and queued": ([snap(0.95, 4), snap(0.97, 6), snap(0.99, 2)], True, 3),
    "full and preempting": ([snap(0.95, 0, preemptions=1), snap(0.96, 0, preemptions=3), snap(0.95, 0, preemptions=6)], True, 2),
    # a prompt of a tenth of the pool: usage dips under 0.9 between admissions, yet it preempts
    "preempting below the threshold": ([snap(0.88, 55, preemptions=3), snap(0.89, 56, preemptions=8), snap(0.87, 55, preemptions=13)], True, 2),
    "queued below the threshold, no preemption": ([snap(0.89, 55, preemptions=3), snap(0.88, 56, preemptions=3), snap(0.87, 55, preemptions=3)], False, 0),
    "full, nobody waits": ([snap(0.95, 0, preemptions=1), snap(0.96, 0, preemptions=1), snap(0.97, 0, preemptions=1)], False, 0),
    "queue but room": ([snap(0.5, 10), snap(0.6, 12), snap(0.55, 9)], False, 0),
    "exactly half": ([snap(0.95, 4), snap(0.95, 4), snap(0.2, 0), snap(0.2, 0)], True, 2),
    "below half": ([snap(0.95, 4), snap(0.2, 0), snap(0.2, 0), snap(0.2, 0)], False, 1),
    "threshold is inclusive": ([snap(0.9, 1), snap(0.9, 1), snap(0.9, 1)], True, 3),
    "sglang retractions": ([snap(0.93, 0, retracted=2, engine="sglang"), snap(0.94, 0, retracted=0, engine="sglang"), snap(0.95, 0, retracted=1, engine="sglang")], True, 2),
    "preemption counter reset": ([snap(0.95, 0, preemptions=50), snap(0.95, 0, preemptions=2), snap(0.95, 0, preemptions=2)], False, 1),
    "two samples": ([snap(0.95, 4), snap(0.97, 6)], None, 2),
    "no usage metric": ([snap(None, 4), snap(None, 6), snap(None, 6)], None, 0),
    "no queue metric": ([snap(0.95, None), snap(0.97, None), snap(0.99, None)], None, 0),
    "idle": ([snap(0.0, 0, 0), snap(0.0, 0, 0), snap(0.0, 0, 0)], None, 0),
    "empty": ([], None, 0),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(PRESSURE_CASES))
def test_pool_pressure(case: str) -> None:
    samples, expected, pressured_samples = PRESSURE_CASES[case]
    result = pool_pressure(samples)
    assert (result.pressured, result.pressured_samples) == (expected, pressured_samples)
    assert result.reasons


def test_pool_pressure_figures() -> None:
    result = pool_pressure(
        [snap(0.8, 0, preemptions=1), snap(0.96, 3, preemptions=4), snap(0.98, 5, preemptions=4)]
    )
    assert result.to_dict() == {
        "pressured": True,
        "samples": 3,
        "pressured_samples": 2,
        "fraction": 2 / 3,
        "max_usage": 0.98,
        "mean_usage": pytest.approx((0.8 + 0.96 + 0.98) / 3),
        "mean_waiting": 8 / 3,
        "preemptions": 3.0,
        "usage_threshold": 0.9,
        "min_fraction": 0.5,
        "reasons": [
            "2 of 3 samples had KV usage >= 90% with requests waiting, or a preemption (67%; needed 50%)"
        ],
    }


@pytest.mark.parametrize(
    ("samples", "reason"),
    [
        ([snap(0.5, 10)] * 3, "KV usage peaked at 50%, below 90%"),
        ([snap(0.95, 4)] * 2, "only 2 usable sample(s); at least 3 needed"),
        ([snap(None)] * 3, "no KV usage metric in any sample (vllm:kv_cache_usage_perc, sglang:token_usage)"),
        ([snap(0.9, None)] * 3, "no waiting-queue or preemption metric: cannot tell a full pool from a busy one"),
        ([snap(0.1, 0, 0)] * 3, "no requests running or waiting in any sample: no load to judge the pool by"),
    ],
)  # fmt: skip
def test_pool_pressure_reasons(samples: list[MetricSnapshot], reason: str) -> None:
    assert reason in pool_pressure(samples).reasons


def test_pool_pressure_options() -> None:
    samples = [snap(0.85, 2)] * 3
    assert pool_pressure(samples).pressured is False
    assert pool_pressure(samples, usage_threshold=0.8).pressured is True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"usage_threshold": 0.0}, "usage_threshold: 0.0 is outside (0, 1]"),
        ({"usage_threshold": 1.5}, "usage_threshold: 1.5 is outside (0, 1]"),
        ({"min_fraction": 0.0}, "min_fraction: 0.0 is outside (0, 1]"),
    ],
)
def test_pool_pressure_bad_options(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(SpecError) as info:
        pool_pressure([snap(0.9, 1)] * 3, **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_pool_pressure_rejects_mixed_engines() -> None:
    with pytest.raises(SpecError) as info:
        pool_pressure([snap(0.9, 1), snap(0.9, 1, engine="sglang")])
    assert str(info.value) == "snapshots: scrapes of different engines (sglang, vllm)"


def test_pool_pressure_from_fixtures() -> None:
    # Three scrapes of a vLLM 0.10 pool at 97 % with 12 waiting: the pool is the limit.
    full = parse_metrics(read("vllm-0.10-v0-old-names.txt"))
    assert pool_pressure([full] * 3).pressured is True
    roomy = parse_metrics(read("vllm-0.11.txt"))
    assert pool_pressure([roomy] * 3).pressured is False


def test_snapshot_to_dict() -> None:
    data = parse_metrics(read("vllm-0.33-dp2.txt"), taken_at=5.0).to_dict()
    assert data["taken_at"] == 5.0
    assert data["kv_capacity_tokens"] == 57808
    assert data["itl"]["buckets"][-1] == ["+Inf", 4000.0]  # type: ignore[index]
    assert set(data) == {
        "engine", "taken_at", "kv_usage", "running", "waiting", "retracted", "preemptions",
        "generation_tokens", "prompt_tokens", "max_total_tokens", "kv_capacity_tokens",
        "kv_cache_dtype", "ttft", "itl", "tpot", "cache_config", "names",
    }  # fmt: skip


# -- a Deployment's verdict from its replicas, and the sample kept in status ---------------


FULL = [snap(0.95, waiting=12.0) for _ in range(4)]
ROOMY = [snap(0.40, waiting=0.0) for _ in range(4)]
TOO_FEW = [snap(0.95, waiting=12.0)]  # below the minimum number of samples: unknown


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        ({"a": FULL, "b": ROOMY}, True),  # one replica queueing is enough: its users wait
        ({"a": ROOMY, "b": ROOMY}, False),
        ({"a": ROOMY, "b": TOO_FEW}, None),  # room only when every replica was judged
        ({"a": FULL, "b": TOO_FEW}, True),
        ({}, None),
    ],
)
def test_deployment_verdict_from_replicas(replicas: dict[str, list], expected: bool | None) -> None:
    pressured, detail, results = pool_pressure_across_replicas(replicas)
    assert pressured is expected
    assert set(results) == set(replicas)
    for name in replicas:
        assert detail.count(f"{name}: ") == 1
    if not replicas:
        assert detail == "no samples"


# -- hostile values: non-finite or absurd numbers are parse errors -----------------------------

_GAUGE = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine="0"}} {}\n'
_RUNNING = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {}\n"
_HIST = (
    "# TYPE vllm:time_to_first_token_seconds histogram\n"
    'vllm:time_to_first_token_seconds_bucket{{le="0.1"}} 1\n'
    'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} 2\n'
    'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} 2\n'
    "vllm:time_to_first_token_seconds_sum {total}\n"
    "vllm:time_to_first_token_seconds_count 2\n"
)


@pytest.mark.parametrize(
    ("text", "metric"),
    [
        (_GAUGE.format("+Inf"), "vllm:kv_cache_usage_perc"),
        (_GAUGE.format("-Inf"), "vllm:kv_cache_usage_perc"),
        (_GAUGE.format("NaN"), "vllm:kv_cache_usage_perc"),
        (_GAUGE.format("1e308"), "vllm:kv_cache_usage_perc"),
        (_GAUGE.format("0.5") + _RUNNING.format("1e308"), "vllm:num_requests_running"),
        (_GAUGE.format("0.5") + _RUNNING.format("-3"), "vllm:num_requests_running"),
        (_GAUGE.format("0.5") + _HIST.format(le="1", total="+Inf"), "vllm:time_to_first_token"),
        (_GAUGE.format("0.5") + _HIST.format(le="NaN", total="1"), "vllm:time_to_first_token"),
        (_GAUGE.format("0.5") + _HIST.format(le="abc", total="1"), "vllm:time_to_first_token"),
    ],
)
def test_non_finite_or_absurd_values_are_parse_errors(text: str, metric: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_metrics(text, source="pod")
    message = str(caught.value)
    assert message.startswith("pod")
    assert metric in message
    assert len(message) < 300


def test_finite_values_still_parse() -> None:
    snapshot = parse_metrics(_GAUGE.format("0.5") + _HIST.format(le="1", total="0.3"))
    assert snapshot.kv_usage == 0.5
    assert snapshot.ttft is not None and snapshot.ttft.buckets[-1] == (math.inf, 2.0)


def test_cache_config_with_odd_digits_has_no_capacity() -> None:
    text = (
        _GAUGE.format("0.5")
        + "# TYPE vllm:cache_config_info gauge\n"
        + 'vllm:cache_config_info{block_size="²",num_gpu_blocks="9'
        + "9" * 5000
        + '"} 1\n'
    )
    assert parse_metrics(text).kv_capacity_tokens is None


def test_a_huge_metrics_text_is_refused() -> None:
    from kvgate.evidence import metrics

    with pytest.raises(ParseError, match="larger than"):
        parse_metrics("#" * (metrics.MAX_METRICS_CHARS + 1), source="pod")


def test_a_json_answer_is_named_as_json_not_echoed() -> None:
    """first-hour-2 N22: `scrape http://A:8000/v1/models` echoed ~600 characters of the JSON."""
    import pytest

    from kvgate.errors import ParseError
    from kvgate.evidence.metrics import parse_metrics

    body = '{"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "secret-looking": "' + "x" * 500
    with pytest.raises(ParseError) as caught:
        parse_metrics(body + '"}]}', source="http://a:8000/v1/models")
    message = str(caught.value)
    assert message == (
        "http://a:8000/v1/models: this is JSON, not Prometheus text: use the engine's /metrics"
    )
