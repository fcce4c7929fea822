"""Can this Deployment be a rollout's target? `check` reads it as the operator will and says
what would stop a rollout, or make it cost more than it should, one finding per problem with
its fix. Nothing here does I/O: `kvgate check` reads the objects (a manifest file or the
cluster) and the operator runs the same check on the live Deployment in Pending.

The canaries copy the Deployment's pod template (kvgate's labels replace its own), so what
holds a production pod holds each canary too: its GPUs, volumes, probes, host ports. An ERROR
means the rollout cannot reach a verdict (the operator ends it `InvalidTarget` at once); a
WARNING may cost the rollout or mislead it, and says when.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Final

from kvgate.change import manifests
from kvgate.engines import launch as engines
from kvgate.engines.launch import EngineInfo
from kvgate.errors import InputError
from kvgate.evidence import kubeobjects
from kvgate.spec.rollout import is_local_path
from kvgate.vocabulary import Engine

# A liveness probe that kills a pod within this long of its start, with no startupProbe to
# hold it off, can kill an engine that is still loading its weights (or building kernels).
MIN_LIVENESS_BUDGET_S: Final = 300
_REPO_ID: Final = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+\Z")  # as kvgate.adapters.hub reads
_LOOPBACK: Final = ("127.", "localhost", "::1", "[::1]")
_GPU_SUFFIX: Final = "/gpu"  # nvidia.com/gpu, amd.com/gpu
_SIM_LABEL_ENV: Final = "KVGATE_SIM_SERVICE_LABEL"
_TOKEN_ENV: Final = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
_FIELD_LABEL: Final = re.compile(r"^metadata\.labels\['([^']+)'\]\Z")


class Severity(StrEnum):
    ERROR = "error"  # the rollout cannot reach a verdict
    WARNING = "warning"  # it may cost the rollout, or mislead it


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    where: str  # the object and field: "container vllm: readinessProbe"
    problem: str
    fix: str

    def line(self) -> str:
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.severity}: {self.where}: {self.problem}{fix}"

    def to_dict(self) -> dict[str, str]:
        return {**asdict(self), "severity": str(self.severity)}


@dataclass(frozen=True, slots=True)
class TargetCheck:
    """What `check` found: problems, and what a rollout of this target needs (`needs`)."""

    deployment: str
    container: str | None = None
    engine: EngineInfo | None = None
    findings: tuple[Finding, ...] = ()
    needs: tuple[str, ...] = ()  # GPUs, chart values: facts, not problems
    gpus_per_pod: int | None = None

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.WARNING)

    def problem(self) -> str | None:
        """The errors as one message (None: none), as the operator's InvalidTarget says it."""
        return "; ".join(f"{f.where}: {f.problem} (fix: {f.fix})" for f in self.errors) or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "kvgate.check",
            "deployment": self.deployment,
            "container": self.container,
            "engine": self.engine.to_dict() if self.engine is not None else None,
            "gpusPerPod": self.gpus_per_pod,
            "findings": [f.to_dict() for f in self.findings],
            "needs": list(self.needs),
            "ok": not self.errors,
        }


@dataclass
class _Found:
    items: list[Finding] = field(default_factory=list)

    def error(self, where: str, problem: str, fix: str) -> None:
        self.items.append(Finding(Severity.ERROR, where, problem, fix))

    def warning(self, where: str, problem: str, fix: str) -> None:
        self.items.append(Finding(Severity.WARNING, where, problem, fix))


def check(
    deployment: Mapping[str, Any],
    *,
    container: str | None = None,
    services: Sequence[Mapping[str, Any]] | None = None,
    claims: Mapping[str, Mapping[str, Any]] | None = None,
) -> TargetCheck:
    """Check `deployment` (an API-shaped dict) as a rollout target.

    `container`: spec.targetRef.container (None: the first). `services` and `claims` (the
    PersistentVolumeClaims by name): None when not known; unknown objects are not checked.
    """
    name = str(_map(deployment.get("metadata")).get("name") or "?")
    spec = _map(deployment.get("spec"))
    template = _map(spec.get("template"))
    pod = _map(template.get("spec"))
    found = _Found()
    containers = pod.get("containers")  # the helpers below read it only once it is checked here
    if containers is not None and not (
        isinstance(containers, list) and all(isinstance(c, Mapping) for c in containers)
    ):
        found.error(
            f"Deployment {name}",
            "spec.template.spec.containers is not a list of containers",
            "write each container as a mapping (name, image, command...)",
        )
        return TargetCheck(name, container, findings=tuple(found.items))
    try:
        _, target = manifests.find_container(pod, container)
    except LookupError as exc:
        found.error(
            f"Deployment {name}",
            str(exc),
            "name the engine's container in spec.targetRef.container (kvgate check -c NAME)"
            if containers
            else "put the engine's container in spec.template.spec.containers",
        )
        return TargetCheck(name, container, findings=tuple(found.items))
    cname = str(target.get("name") or container or "?")
    where = f"container {cname}"
    info: EngineInfo | None = None
    try:
        info = engines.detect_engine(target)
    except InputError as exc:
        found.error(
            where,
            f"engine not readable: {exc}",
            "run `vllm serve MODEL ...` or `python -m sglang.launch_server ...` in command/args "
            "(or the vllm/vllm-openai image with flags in args)",
        )
    if info is not None:
        _engine(found, where, info)
        _model(found, where, info)
    _probes(found, where, target, info)
    gpus = _gpus(found, where, pod)
    _placement(found, name, pod)
    _volumes(found, pod, claims)
    labels = {str(k): str(v) for k, v in _map(_map(template.get("metadata")).get("labels")).items()}
    _selector(found, name, spec)
    _services(found, services, labels)
    _sim_label(found, where, target, labels)
    namespace = _map(deployment.get("metadata")).get("namespace")
    needs = _needs(info, gpus, _int(spec.get("replicas"), 1), namespace, _token_secret(target))
    return TargetCheck(name, cname, info, tuple(found.items), needs, gpus)


def _engine(found: _Found, where: str, info: EngineInfo) -> None:
    if info.host.startswith(_LOOPBACK):
        found.error(
            where,
            f"{info.engine} listens on {info.host}: kvgate, the eval and the "
            "load Job reach a canary by its pod IP",
            "add --host 0.0.0.0 to the args",
        )
    if not info.metrics_enabled:
        flag = engines.FACTS[info.engine].metrics_flag
        found.error(
            where,
            f"{info.engine} serves {info.metrics_path} only with {flag}; kvgate "
            "reads the KV pool and the engine's dtype there",
            f"add {flag} to the args",
        )
    if info.engine is Engine.VLLM and "--disable-log-stats" in info.engine_args:
        found.warning(
            where,
            "--disable-log-stats: vLLM then records no engine metrics, so "
            f"{info.metrics_path} lacks the KV-cache usage kvgate reads",
            "drop --disable-log-stats",
        )
    said = f"{info.engine} serves {info.metrics_path} only with "
    for note in info.findings:  # the reader's own notes (each says its fix), but those above
        if not note.startswith(("SGLang listens on", said)):
            found.warning(where, note, "")


def _model(found: _Found, where: str, info: EngineInfo) -> None:
    model = info.model
    if not model:
        found.warning(
            where,
            "no model in the args: kvgate cannot read the checkpoint's KV "
            "scales nor name the model to the eval",
            "set the rollout's spec.model.name to the hub repo id",
        )
    elif is_local_path(model) or not _REPO_ID.match(model):
        found.warning(
            where,
            (
                f"the model is the local path {model}"
                if is_local_path(model)
                else f"the model {model} is no hub repo id (org/name)"
            )
            + ": the operator reads a local checkpoint only under its own model mounts "
            "(KVGATE_MODEL_DIRS), "
            "else the KV-scale gate says ScalesUnknown",
            "set the rollout's spec.model.name to the hub repo id the files came from, or mount "
            "them into the operator and set KVGATE_MODEL_DIRS with the chart's extraEnv",
        )


def _probes(found: _Found, where: str, c: Mapping[str, Any], info: EngineInfo | None) -> None:
    health = info.health_path if info is not None else "/health"
    port = info.port if info is not None else 8000
    ready, startup, live = (
        _map(c.get(k)) for k in ("readinessProbe", "startupProbe", "livenessProbe")
    )
    if not ready and not startup:
        found.error(
            where,
            "no readinessProbe: a canary counts as Ready when its container starts, and kvgate "
            "reads its startup log then, before the engine has said its KV dtype",
            f"add readinessProbe: {{httpGet: {{path: {health}, port: {port}}}}}",
        )
    if live and not startup:
        budget = _int(live.get("initialDelaySeconds"), 0) + _int(
            live.get("periodSeconds"), 10
        ) * _int(live.get("failureThreshold"), 3)
        if budget < MIN_LIVENESS_BUDGET_S:
            found.warning(
                where,
                f"livenessProbe restarts the engine {budget}s after it starts "
                "if it does not answer, and there is no startupProbe: a canary "
                "still loading weights or building FP8 kernels is killed, and "
                "kvgate ends the rollout CanaryCrashed",
                f"add a startupProbe on {health} with failureThreshold x "
                f"periodSeconds >= {MIN_LIVENESS_BUDGET_S}s",
            )


def _gpus(found: _Found, where: str, pod: Mapping[str, Any]) -> int | None:
    """GPUs one pod asks for (the sum over its containers; None: none asked)."""
    total = 0
    others: set[str] = set()
    for c in pod.get("containers") or []:
        total += kubeobjects.gpu_count(c) or 0
        for kind in ("limits", "requests"):
            amounts = _map(_map(c.get("resources")).get(kind))
            others |= {str(k) for k in amounts if str(k).endswith(_GPU_SUFFIX)}
    others.discard(kubeobjects.GPU_RESOURCE)
    if total or others:
        return total or None
    if not any("kvgate.sim" in str(w) for w in _container_words(pod)):
        found.warning(
            where,
            f"no {kubeobjects.GPU_RESOURCE} in resources.limits: the canaries, "
            "like production's pods, get no GPU",
            "set resources.limits "
            f"{kubeobjects.GPU_RESOURCE}: N as the engine needs (its tensor-"
            "parallel size)",
        )
    return None


def _placement(found: _Found, name: str, pod: Mapping[str, Any]) -> None:
    where = f"Deployment {name}"
    if pod.get("nodeName"):
        found.warning(
            where,
            f"spec.template.spec.nodeName {pod['nodeName']}: both canaries "
            "must fit on that node beside production",
            "use a nodeSelector or affinity instead",
        )
    if pod.get("hostNetwork"):
        found.warning(
            where,
            "hostNetwork: a canary on production's node binds the same port and crashes",
            "drop hostNetwork",
        )
    for c in pod.get("containers") or []:
        ports = c.get("ports")
        for p in ports if isinstance(ports, list) else []:
            if isinstance(p, Mapping) and p.get("hostPort"):
                found.warning(
                    f"container {c.get('name')}",
                    f"hostPort {p['hostPort']}: "
                    "production and the two canaries need three nodes with that port free",
                    "drop hostPort; reach the engine through a Service",
                )


def _volumes(
    found: _Found, pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]] | None
) -> None:
    for volume in pod.get("volumes") or []:
        if not isinstance(volume, Mapping):
            continue
        where = f"volume {volume.get('name')}"
        if "hostPath" in volume:
            path = _map(volume.get("hostPath")).get("path")
            found.warning(
                where,
                f"hostPath {path}: a canary reads that path on whichever node "
                "it lands, which may not hold the model",
                "use a ReadOnlyMany or ReadWriteMany volume, or pin every "
                "node that has the path with a nodeSelector",
            )
        claim = _map(volume.get("persistentVolumeClaim")).get("claimName")
        if not claim:
            continue
        where = f"{where} (PersistentVolumeClaim {claim})"
        pvc = claims.get(str(claim)) if claims is not None else None
        if pvc is None:
            found.warning(
                where,
                "its access mode is unknown (the claim was not given): a "
                "ReadWriteOncePod claim leaves both canaries unschedulable",
                "put the PVC in the file, or check the live Deployment "
                "(kvgate check --deployment NAME)",
            )
            continue
        listed = _map(pvc.get("spec")).get("accessModes")
        modes = {str(m) for m in listed} if isinstance(listed, list) else set()
        if modes & {"ReadOnlyMany", "ReadWriteMany"}:
            continue
        if "ReadWriteOncePod" in modes:
            found.error(
                where,
                "ReadWriteOncePod: production's pod holds it, so neither canary can start",
                "serve the model from a ReadOnlyMany or ReadWriteMany "
                "claim, the image, or an emptyDir the pod downloads into",
            )
        elif "ReadWriteOnce" in modes:
            found.warning(
                where,
                "ReadWriteOnce: the canaries can only run on the node that mounts it, so that node "
                "needs the canaries' GPUs free beside production",
                "use a ReadOnlyMany or ReadWriteMany claim for the model",
            )


def _selector(found: _Found, name: str, spec: Mapping[str, Any]) -> None:
    if not _map(_map(spec.get("selector")).get("matchLabels")):
        found.warning(
            f"Deployment {name}",
            "spec.selector has no matchLabels: kvgate finds production's pods by them, so "
            "Preflight samples none and the pool's pressure stays unknown",
            "select the pods with matchLabels",
        )


def _services(
    found: _Found, services: Sequence[Mapping[str, Any]] | None, labels: Mapping[str, str]
) -> None:
    canary = manifests.child_labels("any", "control")
    for svc in services or ():
        selector = {str(k): str(v) for k, v in _map(_map(svc.get("spec")).get("selector")).items()}
        if not selector:
            continue
        sname = _map(svc.get("metadata")).get("name") or "?"
        ours = all(k.startswith("kvgate.io/") or canary.get(k) == v for k, v in selector.items())
        if ours:
            found.error(
                f"Service {sname}",
                f"selects {_labels(selector)}, which kvgate's "
                "canaries carry: production traffic would reach them and skew every measurement",
                f"select production's own pod labels ({_labels(labels) or 'none set'})",
            )


def _sim_label(found: _Found, where: str, c: Mapping[str, Any], labels: Mapping[str, str]) -> None:
    for env in c.get("env") or []:
        if not isinstance(env, Mapping) or env.get("name") != _SIM_LABEL_ENV:
            continue
        path = _map(_map(_map(env.get("valueFrom")).get("fieldRef"))).get("fieldPath")
        match = _FIELD_LABEL.match(str(path or ""))
        if match and match.group(1) not in labels:
            found.warning(
                where,
                f"{_SIM_LABEL_ENV} reads label {match.group(1)}, which the "
                "pod template does not carry: the simulated production gets no traffic",
                "name a label the pods carry and the Service selects",
            )


def _needs(
    info: EngineInfo | None, gpus: int | None, replicas: int, namespace: Any, secret: str | None
) -> tuple[str, ...]:
    ns = str(namespace) if namespace else "the Deployment's namespace"
    out = []
    if info is not None:
        served = info.model or "no model named"
        out.append(
            f"engine: {info.engine} serving {served} on port {info.port} "
            f"({info.metrics_path}), KV cache dtype {info.kv_cache_dtype}"
        )
    if gpus:
        out.append(
            f"GPUs: each canary takes {gpus} {kubeobjects.GPU_RESOURCE}, so a rollout needs "
            f"{2 * gpus} free from Canary until the verdict, beside production's {replicas * gpus}"
        )
    out.append(f"chart: watch.namespaces includes {ns} (or watch.allNamespaces=true)")
    out.append(
        "chart: config.gsm8kDir=/data/gsm8k (the default) needs an eval image built with "
        "GSM8K; config.gsm8kDir= makes the eval Job download it from huggingface.co"
    )
    if info is not None and info.model and _REPO_ID.match(info.model):
        out.append(
            f"chart: config.hubOffline=true when the operator cannot reach "
            f"huggingface.co (it reads {info.model}'s safetensors headers there for the "
            "KV scales; offline they are unknown)"
        )
    if secret:
        out.append(
            f"chart: hubTokenSecrets.enabled=true for a gated model, with Secret {secret} "
            "labelled kvgate.io/hub-token=true and named in the rollout's spec.model.tokenSecretRef"
        )
    return tuple(out)


def _token_secret(c: Mapping[str, Any]) -> str | None:
    """The Secret the engine reads its hub token from (None: none)."""
    for env in c.get("env") or []:
        if isinstance(env, Mapping) and env.get("name") in _TOKEN_ENV:
            ref = _map(_map(env.get("valueFrom")).get("secretKeyRef"))
            if ref.get("name"):
                return str(ref["name"])
    return None


def _container_words(pod: Mapping[str, Any]) -> list[Any]:
    words: list[Any] = []
    for c in pod.get("containers") or []:
        words += list(c.get("command") or []) + list(c.get("args") or [])
    return words


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
