"""Production's pool history and the arms' GPU clocks from Prometheus (`config.prometheusURL`)
instead of live scrapes.

`pool_history`: one `query_range` over the window reads the engine's pool series (names from
`kvgate.evidence.metrics`, preferred first) of the production pods, matched by the scrape's
`instance` label (`<pod IP>:<port>`, what kubernetes_sd's pod role and static targets both
give). Each evaluation step becomes one `MetricSnapshot`, reduced like a parsed `/metrics`. A
pod Prometheus has no samples of has an unknown pool, never judged.

`gpu_clocks`: dcgm-exporter's SM and memory clocks (`CLOCK_METRICS`) of the arms' pods, matched
by the labels of its pod mapping (`clock_query`).

Any failure (unreachable, slow, HTTP error, `status: error`, junk or oversized JSON, values
outside what an engine exports) is a `PrometheusError`: the caller's "unknown", never a
verdict. The request goes through `adapters.http.scrape` (the whole request bounded by
`timeout`, the body by `max_bytes`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx

from kvgate.adapters import http
from kvgate.errors import ParseError, PrometheusError, ScrapeError, brief
from kvgate.evidence import metrics
from kvgate.records.status import MAX_MHZ, ClockReading, ClockRecord
from kvgate.vocabulary import ENGINE_NAMES

# A matrix over a few pods and a window of tens of steps is tens of KiB.
MAX_BODY_BYTES: Final = 8 << 20
MAX_SERIES: Final = 5000
MAX_POINTS: Final = 11000  # Prometheus' own limit of points per series of a range query
DEFAULT_TIMEOUT: Final = 10.0

# concept -> metric names per engine, preferred first: the pool sample's fields, and the
# histograms whose running totals a pool record keeps (kvgate.evidence.metrics holds the names).
_POOL_CONCEPTS: Final = tuple(f for f in metrics.POOL_SAMPLE_FIELDS if f != "engine")
# TTFT: the verify window's baseline; request lengths: the load Job's workload
# (throughput.production_lengths). Their sum and count only: status keeps no buckets.
_HISTOGRAM_TOTALS: Final = ("ttft", "prompt_lengths", "output_lengths")


def _names(engine: str) -> dict[str, tuple[str, ...]]:
    table = {**metrics.GAUGES, **metrics.COUNTERS}
    names = {concept: table[concept][engine] for concept in _POOL_CONCEPTS}
    for concept in _HISTOGRAM_TOTALS:
        family = metrics.HISTOGRAMS[concept][engine]
        names[f"{concept}_sum"] = tuple(n + "_sum" for n in family)
        names[f"{concept}_count"] = tuple(n + "_count" for n in family)
    return names


def _totals(
    values: dict[str, float | None], chosen: Mapping[str, str], concept: str
) -> tuple[metrics.Histogram | None, str | None]:
    """One histogram's step totals (taken out of `values`), bucketless, and the name read."""
    total, count = values.pop(f"{concept}_sum"), values.pop(f"{concept}_count")
    if total is None or count is None:
        return None, None
    return metrics.Histogram((), total, count), chosen[f"{concept}_sum"].removesuffix("_sum")


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range query: its labels and `(unix time, value)` points, ascending."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


def _fail(source: str, message: str) -> PrometheusError:
    return PrometheusError(source, message)


def _point(raw: Any, source: str) -> tuple[float, float]:
    if not (isinstance(raw, list) and len(raw) == 2):
        raise _fail(source, f'a point is {brief(raw)}, not [time, "value"]')
    ts, value = raw
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise _fail(source, f"a point's time is {brief(ts)}, not a unix time")
    if not isinstance(value, str) or len(value) > 40:
        raise _fail(source, f"a point's value is {brief(value)}, not a number string")
    try:
        number = float(value)
    except ValueError:
        raise _fail(source, f"a point's value is {brief(value)}, not a number") from None
    return float(ts), number


def parse_matrix(body: str, *, source: str = "prometheus") -> tuple[Series, ...]:
    """A `/api/v1/query_range` answer -> its series; anything else is a PrometheusError."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _fail(source, f"the answer is not JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise _fail(source, f"the answer is {brief(doc)}, not a JSON object")
    if doc.get("status") != "success":
        error = doc.get("error")
        shown = brief(error, 200) if error is not None else brief(doc.get("status"))
        raise _fail(source, f"the query failed: {shown}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        got = brief(data.get("resultType")) if isinstance(data, dict) else brief(data)
        raise _fail(source, f"the answer's data is {got}, not a matrix")
    result = data.get("result")
    if not isinstance(result, list):
        raise _fail(source, f"data.result is {brief(result)}, not a list")
    if len(result) > MAX_SERIES:
        raise _fail(source, f"{len(result)} series, more than {MAX_SERIES}; narrow the query")
    out: list[Series] = []
    for item in result:
        if not isinstance(item, dict):
            raise _fail(source, f"a series is {brief(item)}, not an object")
        labels, values = item.get("metric"), item.get("values")
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise _fail(source, f"a series' metric is {brief(labels)}, not string labels")
        if not isinstance(values, list):
            raise _fail(source, f"a series' values are {brief(values)}, not a list")
        if len(values) > MAX_POINTS:
            raise _fail(source, f"a series has {len(values)} points, more than {MAX_POINTS}")
        points = tuple(sorted(_point(v, source) for v in values))
        out.append(Series(labels=dict(labels), points=points))
    return tuple(out)


def query_range(
    base_url: str,
    query: str,
    *,
    start: float,
    end: float,
    step: float,
    timeout: float = DEFAULT_TIMEOUT,
    client: httpx.Client | None = None,
) -> tuple[Series, ...]:
    """Run a PromQL range query; every failure is a PrometheusError naming the server."""
    source = base_url.rstrip("/")
    params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    url = str(httpx.URL(source + "/api/v1/query_range", params=params))
    try:
        body = http.scrape(url, client=client, timeout=timeout, max_bytes=MAX_BODY_BYTES)
    except ScrapeError as exc:
        # The URL carries the query: say which server, and what failed after the URL.
        raise _fail(source, str(exc).removeprefix(exc.url).lstrip(": ")[:300]) from None
    return parse_matrix(body, source=source)


def _regex_escape(text: str) -> str:
    """PromQL regexes are RE2 in a double-quoted string: escape for both."""
    return re.escape(text).replace("\\", "\\\\")


def _host(instance: str) -> str:
    """`10.0.0.5:8000` -> `10.0.0.5`, `[fd00::5]:8000` -> `fd00::5`."""
    host = instance.rsplit(":", 1)[0] if instance.count(":") == 1 or "]" in instance else instance
    return host.strip("[]")


def pool_query(engine: str, ips: Sequence[str]) -> str:
    """The one PromQL selector of every pool series of these pod IPs."""
    names = sorted({n for group in _names(engine).values() for n in group})
    name_re = "|".join(_regex_escape(n) for n in names)
    hosts = "|".join(_regex_escape(f"[{ip}]" if ":" in ip else ip) for ip in sorted(set(ips)))
    return f'{{__name__=~"{name_re}",instance=~"({hosts})(:[0-9]+)?"}}'


_Row = tuple[str, Mapping[str, str], float]


def snapshots_from_series(
    engine: str, pods: Mapping[str, str], found: Sequence[Series], *, source: str = "prometheus"
) -> dict[str, list[metrics.MetricSnapshot]]:
    """Range-query series -> one MetricSnapshot per pod and evaluation step (pure)."""
    names = _names(engine)
    by_ip: dict[str, list[str]] = defaultdict(list)
    for pod, ip in pods.items():
        by_ip[ip].append(pod)
    # pod -> evaluation time -> (metric name, labels, value): one exposition per step.
    table: dict[str, dict[float, list[_Row]]] = {pod: defaultdict(list) for pod in pods}
    for s in found:
        metric = s.labels.get("__name__", "")
        labels = {k: v for k, v in s.labels.items() if k != "__name__"}
        for pod in by_ip.get(_host(s.labels.get("instance", "")), ()):
            for ts, value in s.points:
                table[pod][ts].append((metric, labels, value))
    out: dict[str, list[metrics.MetricSnapshot]] = {}
    for pod, by_time in table.items():
        snaps: list[metrics.MetricSnapshot] = []
        for ts in sorted(by_time):
            # The same reduction as a parsed /metrics (metrics.reduce_concepts).
            try:
                values, chosen = metrics.reduce_concepts(
                    metrics.samples_of(by_time[ts]), names, source
                )
            except ParseError as exc:
                raise _fail(source, str(exc).removeprefix(f"{source}: ")) from None
            histograms: dict[str, Any] = {}  # the snapshot's fields: ttft, prompt/output_lengths
            names_read = {c: n for c, n in chosen.items() if c in _POOL_CONCEPTS}
            for concept in _HISTOGRAM_TOTALS:
                histograms[concept], name = _totals(values, chosen, concept)
                if name is not None:  # as parse_metrics names a histogram: its family
                    names_read[concept] = name
            # The pool fields as a stored pool sample holds them, the histograms' totals as
            # sources.pool_record keeps them of a scrape; the rest unknown.
            pool = metrics.snapshot_from_pool_sample({**values, "engine": engine})
            snaps.append(dataclasses.replace(pool, **histograms, names=names_read, taken_at=ts))
        out[pod] = snaps
    return out


def pool_history(
    base_url: str,
    engine: str,
    pods: Mapping[str, str],
    *,
    window_s: float,
    step_s: float,
    now: float,
    timeout: float = DEFAULT_TIMEOUT,
    client: httpx.Client | None = None,
) -> dict[str, list[metrics.MetricSnapshot]]:
    """Each pod's (name -> IP) pool snapshots over `[now - window_s, now]`, one per `step_s`."""
    if engine not in ENGINE_NAMES:
        raise _fail(base_url, f"engine {brief(engine)} is not vllm or sglang")
    if not pods:
        return {}
    found = query_range(
        base_url,
        pool_query(engine, list(pods.values())),
        start=now - window_s,
        end=now,
        step=step_s,
        timeout=timeout,
        client=client,
    )
    return snapshots_from_series(engine, pods, found, source=base_url.rstrip("/"))


# dcgm-exporter's clock fields (etc/default-counters.csv), labelled with the pod of the GPU.
CLOCK_METRICS: Final = {"sm": "DCGM_FI_DEV_SM_CLOCK", "mem": "DCGM_FI_DEV_MEM_CLOCK"}


def clock_query(namespace: str, pods: Sequence[str]) -> str:
    """The PromQL of both clocks of these pods (dcgm-exporter's pod mapping).

    Scraped with honor_labels the exporter's `pod`/`namespace` are kept; without it Prometheus
    renames them `exported_pod`/`exported_namespace` (and `pod` is the exporter's own): both.
    """
    names = "|".join(_regex_escape(n) for n in CLOCK_METRICS.values())
    pod_re = "|".join(_regex_escape(p) for p in sorted(set(pods)))
    ns = namespace.replace("\\", "\\\\").replace('"', '\\"')
    honored = f'{{__name__=~"{names}",namespace="{ns}",pod=~"{pod_re}"}}'
    renamed = f'{{__name__=~"{names}",exported_namespace="{ns}",exported_pod=~"{pod_re}"}}'
    return f"{honored} or {renamed}"


def clocks_from_series(
    pods: Sequence[str], found: Sequence[Series], *, source: str = "prometheus"
) -> dict[str, ClockRecord | None]:
    """Range-query series -> each pod's clocks over the window (pure; None: no series).

    Every GPU of a pod (tensor parallel) and every point count: the mean is over all of them,
    the range their lowest and highest.
    """
    by_metric = {name: key for key, name in CLOCK_METRICS.items()}
    values: dict[str, dict[str, list[float]]] = {pod: defaultdict(list) for pod in pods}
    for s in found:
        key = by_metric.get(s.labels.get("__name__", ""))
        pod = s.labels.get("exported_pod") or s.labels.get("pod", "")
        if key is None or pod not in values:
            continue
        for _, value in s.points:
            if not (0 < value < MAX_MHZ):  # NaN fails too
                raise _fail(source, f"{s.labels['__name__']} of pod {pod} is {value:g} MHz")
            values[pod][key].append(value)
    out: dict[str, ClockRecord | None] = {}
    for pod in pods:
        readings = {
            key: ClockReading(sum(v) / len(v), min(v), max(v)) if v else None
            for key, v in ((k, values[pod].get(k, [])) for k in CLOCK_METRICS)
        }
        has_any = any(r is not None for r in readings.values())
        out[pod] = ClockRecord.of(sm=readings["sm"], mem=readings["mem"]) if has_any else None
    return out


def gpu_clocks(
    base_url: str,
    namespace: str,
    pods: Sequence[str],
    *,
    start: float,
    end: float,
    timeout: float = DEFAULT_TIMEOUT,
    client: httpx.Client | None = None,
) -> dict[str, ClockRecord | None]:
    """Each pod's SM and memory clocks over `[start, end]` from the DCGM series in Prometheus."""
    if not pods:
        return {}
    if not end > start:
        raise _fail(base_url, f"the clock window [{start:.0f}, {end:.0f}] is empty")
    step = max(1.0, (end - start) / 300)  # at most ~300 points per series
    found = query_range(
        base_url,
        clock_query(namespace, pods),
        start=start,
        end=end,
        step=step,
        timeout=timeout,
        client=client,
    )
    return clocks_from_series(pods, found, source=base_url.rstrip("/"))
