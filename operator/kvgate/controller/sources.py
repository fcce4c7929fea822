"""Where evidence is read: an engine's /metrics, /server_info and logs, the checkpoint headers,
Prometheus. Each function takes what it reads from (IP, URL, engine, timeout, client) as
arguments, not the reconcile's context, and writes no status.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from kvgate import redact
from kvgate.adapters import http, hub
from kvgate.change import manifests
from kvgate.controller.kubeapi import KubeApi
from kvgate.engines import launch as engines
from kvgate.errors import ExternalError, InputError, KvgateError, ScrapeError, SpecError, brief
from kvgate.evidence import logs, metrics, poolsample
from kvgate.evidence.logs.containers import joined, per_container
from kvgate.records.codec import read_record, whole
from kvgate.records.status import (
    CacheTruth,
    ClocksRecord,
    HistogramTotals,
    PoolSample,
    RolloutStatus,
    ScanRecord,
)
from kvgate.vocabulary import PROMETHEUS_SOURCE

if TYPE_CHECKING:
    from kvgate.config import OperatorConfig
    from kvgate.spec.rollout import CapacityGate, RolloutSpec, SecretKeyRef

Series = dict[str, list[PoolSample]]  # kept pool samples per production pod


def canary_port(status: RolloutStatus) -> int:
    """The engine's port, as Pending read it from the container."""
    return 8000 if status.port is None else status.port


def metrics_url(status: RolloutStatus, ip: str) -> str:
    """The engine's /metrics at `ip`, on the port and path Pending read from the container."""
    return f"http://{ip}:{canary_port(status)}{status.metrics_path or '/metrics'}"


def cache_truth(status: RolloutStatus, ip: str, timeout: float) -> CacheTruth:
    """What the engine's /metrics at `ip` states of its KV cache (`metrics.cache_truth`)."""
    truth: CacheTruth = read_record(
        CacheTruth, metrics.cache_truth(scrape_engine(status, ip, timeout))
    )
    return truth


def scrape_engine(status: RolloutStatus, ip: str, timeout: float) -> metrics.MetricSnapshot:
    return scrape_pod(metrics_url(status, ip), status.engine, timeout)


def scrape_pod(url: str, engine: str | None, timeout: float) -> metrics.MetricSnapshot:
    """One pod's /metrics, read with the operator's deadline and parsed for this engine."""
    return metrics.parse_metrics(http.scrape(url, timeout=timeout), engine)


def server_info(ip: str, port: Any, timeout: float) -> dict[str, object]:
    """SGLang's server info from /server_info (else /get_server_info, before 0.5.6), the dtype
    source its /metrics lack: `metrics.ServerInfo.to_status()`, or {"absent": why}."""
    base = f"http://{ip}:{port}"
    for path in metrics.SERVER_INFO_PATHS:
        try:
            body = http.scrape(base + path, timeout=timeout)
        except ScrapeError as exc:
            if exc.status == 404:
                continue
            raise
        return metrics.parse_server_info(body, path).to_status()
    return {"absent": f"HTTP 404 on {' and '.join(metrics.SERVER_INFO_PATHS)}"}


def hub_token_problem(
    kube: KubeApi, config: OperatorConfig, namespace: str, spec: RolloutSpec
) -> str | None:
    """Why spec.model.tokenSecretRef may not be used (None: it may, or there is none): only with
    the operator's opt-in (KVGATE_HUB_TOKEN_SECRETS) and for a Secret that passes the adapter's
    hub-token rule. A rollout author must not be able to hand another Secret of the namespace
    to the eval Job, whose kubelet resolves it without kvgate."""
    secret = spec.model.token_secret
    if secret is None:
        return None
    if not config.hub_token_secrets:
        return (
            f"spec.model.tokenSecretRef: this operator does not use hub-token Secrets "
            f"(chart value hubTokenSecrets.enabled=false); remove the field or ask its admin "
            f"to enable them and label Secret {secret.name} kvgate.io/hub-token=true"
        )
    try:
        kube.check_hub_token_secret(namespace, secret.name, secret.key)
    except InputError as exc:
        text = str(exc)
        return text if text.startswith("spec.model") else f"spec.model.tokenSecretRef: {text}"
    return None


FORGE_TOKEN_FIELD: Final = "spec.promotion.pullRequest.tokenSecretRef"


def forge_token_problem(
    kube: KubeApi, config: OperatorConfig, namespace: str, spec: RolloutSpec
) -> str | None:
    """Why this rollout's forge token cannot be used (None: it can, or no pullRequest mode):
    the operator's opt-in (KVGATE_FORGE_TOKEN_SECRETS) and the Secret's label."""
    pr = spec.promotion.pull_request
    if pr is None:
        return None
    secret = pr.token_secret
    if not config.forge_token_secrets:
        return (
            f"{FORGE_TOKEN_FIELD}: this operator does not use forge-token Secrets (the chart value "
            f"forgeTokenSecrets.enabled is off); ask its admin to enable them, and label Secret "
            f"{secret.name} kvgate.io/forge-token=true"
        )
    try:
        kube.read_forge_token(
            namespace, secret.name, secret.key, api_url=pr.api_url, repository=pr.repository
        )
    except InputError as exc:
        text = str(exc)
        return text if text.startswith(FORGE_TOKEN_FIELD) else f"{FORGE_TOKEN_FIELD}: {text}"
    return None


def arm_tpot_totals(
    status: RolloutStatus, ips: Mapping[str, str | None], timeout: float
) -> dict[str, HistogramTotals]:
    """Each arm's TPOT histogram totals now (arms without an IP are left out)."""
    out: dict[str, HistogramTotals] = {}
    for arm in manifests.ARMS:
        ip = ips.get(arm)
        if not ip:
            continue
        try:
            snap = scrape_engine(status, ip, timeout)
        except (ExternalError, InputError) as exc:
            out[arm] = HistogramTotals(error=str(exc)[:300])
            continue
        hist = snap.tpot or snap.itl
        if hist is not None:
            out[arm] = HistogramTotals(sum=whole(hist.sum), count=whole(hist.count))
    return out


def production_kv_dtype(container: Mapping[str, Any] | None) -> str:
    """The --kv-cache-dtype the production container runs (`auto` when unset or unreadable),
    cut to a format name's length (the CRD's 64): it reaches status and its messages."""
    try:
        dtype = engines.detect_engine(container).kv_cache_dtype if container else "auto"
    except InputError:
        return "auto"
    return dtype if len(dtype) <= MAX_FORMAT_CHARS else brief(dtype, MAX_FORMAT_CHARS)


MAX_FORMAT_CHARS = 64  # spec.kvCache.format's maxLength in the CRD


def under_model_dirs(path: str, dirs: tuple[str, ...]) -> bool:
    """Whether `path`, links resolved, lies inside one of the operator's model mounts."""
    real = os.path.realpath(path)
    for d in dirs:
        root = os.path.realpath(d)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


def scan_checkpoint(
    model: str | None,
    *,
    revision: str | None,
    model_dirs: tuple[str, ...],
    hub_offline: bool,
    token_secret: SecretKeyRef | None,
    kube: KubeApi,
    namespace: str,
    kv_cache_dtype: str = "fp8",
    skip_layers: Sequence[str] = (),
    control_kv_dtype: str = "auto",
    engine: str = "vllm",
) -> dict[str, Any]:
    """KV scales and capacity math from the checkpoint headers; any failure is a finding. A skip
    list naming a layer the model does not have is `skipLayersProblem` (vLLM would start and skip
    nothing for it); head_dim and the sliding-window layers are kept for
    `kvgate.checkpoint.advice`. `token_secret`: already allowed by the operator (or None).
    `control_kv_dtype`: the --kv-cache-dtype production runs; what it stores on this checkpoint
    is `effectiveControlFormat`, and the expected gain is counted from it."""
    if not model:
        return {"finding": "no model in the spec or the container args"}
    local = model.startswith(("/", "./", "../")) or not hub.looks_like_repo_id(model)
    if local and not under_model_dirs(model, model_dirs):
        # Never probe the path: existence and size would be an oracle on the operator's files.
        return {
            "finding": "spec.model.name: a hub repo id, or a path under the operator's model "
            "mounts (KVGATE_MODEL_DIRS); this is neither"
        }
    if not local and hub_offline:
        return {"finding": f"{model}: hub not consulted (HF_HUB_OFFLINE)"}
    secret, token = token_secret, None
    try:
        token = kube.read_secret_value(namespace, secret.name, secret.key) if secret else None
        headers = (
            hub.read_local_checkpoint(model)
            if local
            else hub.read_hub_checkpoint(model, revision=revision, token=token)
        )
        layout, scales = headers.analyse()
        control = scales.effective_kv_format(control_kv_dtype, engine)
    except KvgateError as exc:  # unreachable hub, no weights...: the scales gate decides
        # Say what failed, never what was sent: transport errors can quote headers, and a token
        # of no known shape (a mirror's) is only hidden by value.
        return {"finding": redact.hide(f"{type(exc).__name__}: {exc}", token)[:500]}
    return {
        "source": headers.source,
        "commit": headers.commit,
        "present": scales.present,
        "coverage": scales.coverage,
        "forcesFp8Kv": list(scales.forces_fp8_kv),
        "expectedCapacityGain": _capacity_gain(layout, control, kv_cache_dtype, skip_layers),
        "skipLayersProblem": _skip_layers_problem(layout, kv_cache_dtype, skip_layers),
        "headDim": layout.head_dim,
        "kvLayers": layout.kv_layers,
        "slidingWindowLayers": layout.sliding_window_layers,
        "kvBytesPerToken": {d: layout.bytes_per_token(d) for d in ("bf16", "fp8")},
        "brokenScales": _capped(scales.to_dict()["values"]["broken"]),
        "effectiveControlFormat": control,
    }


# A checkpoint's header names as many layers as it likes: the status keeps the first few broken
# scales and a count, so a hostile header cannot grow the object past what the apiserver stores.
BROKEN_SCALES_KEPT = 16


def _capped(broken: list[str]) -> list[str]:
    if len(broken) <= BROKEN_SCALES_KEPT:
        return broken
    return [*broken[:BROKEN_SCALES_KEPT], f"and {len(broken) - BROKEN_SCALES_KEPT} more"]


def _capacity_gain(
    layout: Any, control: str, kv_cache_dtype: str, skip_layers: Sequence[str] = ()
) -> float | None:
    """The candidate format's tokens per token of the control's (kvgate.checkpoint.formats);
    None if unsized."""
    from kvgate.checkpoint.formats import expected_capacity_gain

    try:
        return expected_capacity_gain(layout, control, kv_cache_dtype, skip_layers=skip_layers)
    except KvgateError:
        return None


def _skip_layers_problem(
    layout: Any, kv_cache_dtype: str, skip_layers: Sequence[str]
) -> str | None:
    """`spec.kvCache.skipLayers[i]: ...` when an entry is not a layer of this model."""
    try:
        layout.skipped_layers(kv_cache_dtype, skip_layers=skip_layers)
    except SpecError as exc:
        return f"spec.{exc}"
    except KvgateError:
        return None  # an unknown format: the capacity gain says unsized
    return None


def pool_record(snap: metrics.MetricSnapshot) -> PoolSample:
    """What status keeps of one pool sample (`poolsample.record`)."""
    return poolsample.record(snap)


def pool_history(
    prometheus_url: str,
    engine: str,
    ips: dict[str, str],
    *,
    gate: CapacityGate,
    now: float,
    elapsed_s: float,
    timeout: float,
) -> tuple[list[str], Series | None]:
    """Production's pool samples over the last window from Prometheus (None: no answer)."""
    from kvgate.adapters import prometheus

    try:
        found = prometheus.pool_history(
            prometheus_url,
            engine,
            ips,
            window_s=gate.window_s,
            step_s=gate.interval_s,
            now=now,
            timeout=timeout,
        )
    except ExternalError as exc:  # unreachable, erroring or junk: unknown, never a verdict
        return [redact.scrub_text(str(exc))[:500]], None
    short = {pod: len(s) for pod, s in found.items() if len(s) < gate.samples}
    if short and elapsed_s < gate.sampling_deadline_s - gate.interval_s:
        # Prometheus has not scraped a whole window yet (new pods, a new server): ask again.
        shown = ", ".join(f"{pod}: {n}" for pod, n in sorted(short.items()))
        return [f"Prometheus holds fewer than {gate.samples} samples in the window ({shown})"], None
    return [], {pod: [pool_record(s) for s in snaps] for pod, snaps in found.items()}


def sample_pool(
    ips: Mapping[str, str], series: Series, scrape: Callable[[str], metrics.MetricSnapshot]
) -> list[str]:
    """One scrape of each Ready production pod, appended to `series`; the errors."""
    errors = []
    for name, ip in ips.items():
        try:
            snap = scrape(ip)
        except (ExternalError, InputError) as exc:  # a bad scrape is a missing sample
            errors.append(str(exc))
            continue
        series.setdefault(name, []).append(pool_record(snap))
    return errors


def pod_logs(
    kube: KubeApi, namespace: str, pod: str, container: str | None, *, previous: bool = True
) -> tuple[str, str]:
    """The previous container's log (when `previous`) and the current one's ("" when none)."""
    before = (kube.read_log(namespace, pod, container, previous=True) or "") if previous else ""
    return before, kube.read_log(namespace, pod, container) or ""


def scan_engine_log(text: str, engine: str | None, *, previous: str | None = None) -> ScanRecord:
    """The engine log's scan (`logs.scan_log`), compacted for status. With the `previous`
    container's log, both are scanned as one and each line is named in its own log."""
    whole, previous_lines = joined(previous, text)
    scan = logs.scan_log(whole, engine=engine).status_record()
    return compact_scan(per_container(scan, previous_lines))


def compact_scan(scan: ScanRecord) -> ScanRecord:
    """Keep status small: at most 20 findings, each line text cut to 300 characters and
    scrubbed (engines print their args)."""
    findings = tuple(
        f if f.text is None else dataclasses.replace(f, text=redact.clipped(f.text, 300))
        for f in scan.findings[:20]
    )
    return dataclasses.replace(scan, findings=findings)


def speed_clocks(
    prometheus_url: str,
    namespace: str,
    rollout: str,
    started_at: Any,
    *,
    now: float,
    timeout: float,
) -> ClocksRecord:
    """Both arms' DCGM clocks over the speed window from Prometheus; a note says what is missing.
    A Prometheus that fails raises (retried, and past the limit the rollout ends without
    promoting); only an answer without DCGM series (no dcgm-exporter) leaves them unknown."""
    from kvgate.adapters import prometheus

    pods = {arm: manifests.canary_name(rollout, arm) for arm in manifests.ARMS}
    start = float(started_at) if isinstance(started_at, int | float) else now - 300.0
    found = prometheus.gpu_clocks(
        prometheus_url,
        namespace,
        list(pods.values()),
        start=min(start, now - 1.0),
        end=now,
        timeout=timeout,
    )
    control, candidate = found.get(pods["control"]), found.get(pods["candidate"])
    missing = [pods[arm] for arm, c in (("control", control), ("candidate", candidate)) if not c]
    note = f"no DCGM clock series for pod {', '.join(missing)} in Prometheus" if missing else None
    return ClocksRecord(PROMETHEUS_SOURCE, control, candidate, note)
