"""An in-memory stand-in for `kvgate.adapters.kube.Kube`, for the controller's unit tests.

It keeps Deployments, Pods, Jobs and ConfigMaps as API-shaped dicts and plays the parts of
the cluster the controller depends on: a patched Deployment rolls out at once (new pods
with the new container, the status counters of a finished rollout), a created Pod is Running
and Ready with an IP and an engine log that matches its args, a created Job completes with
the eval summary in its pod's log. Faults are switches: `crash_at` kills the "operator"
(raises `Crash`, a BaseException nothing in kvgate catches) before or after the Nth mutating
call, `refuse_patches` answers patches with an error, `crash_new_pods` makes pods of the
candidate config crash.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonpatch

from kvgate.errors import KubeError, ScrapeError

DATA = Path(__file__).resolve().parents[1] / "data"
CONTROL_LOG = (DATA / "logs" / "vllm-0.11-bf16-ready.txt").read_text()
CANDIDATE_LOG = (DATA / "logs" / "vllm-0.16-fp8-scales-triton-ready.txt").read_text()
METRICS = (DATA / "metrics" / "vllm-0.11.txt").read_text()
JIT_FAILED_LOG = (DATA / "logs" / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt").read_text()
_CACHE_INFO = next(
    line for line in METRICS.splitlines() if line.startswith("vllm:cache_config_info")
)
_JOB_DONE: dict[str, Any] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
SUMMARY_PASS = {
    "kind": "kvgate.eval/summary",
    "verdict": "pass",
    "control": {"correct": 460, "total": 500, "accuracy": 0.92},
    "candidate": {"correct": 458, "total": 500, "accuracy": 0.916},
    "paired": {"difference": -0.004, "tango95": [-0.019, 0.011]},
    "margin": 0.03,
    "questions_used": 500,
}


_JOB_FAILED: dict[str, Any] = {
    "failed": 1,
    "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit"}],
}  # fmt: skip


def _stage(concurrency: int, tok_s: float | None, tpot_ms: float = 20.0) -> dict[str, Any]:
    """One stage of the load summary: measured at `tok_s`, or (None) an error stage."""
    if tok_s is None:
        return {"concurrency": concurrency, "requests": 2 * concurrency, "status": "error",
                "successes": concurrency, "failures": concurrency,
                "reasons": [f"{concurrency} of {2 * concurrency} requests failed"]}  # fmt: skip
    return {"concurrency": concurrency, "requests": 2 * concurrency, "status": "measured",
            "successes": 2 * concurrency, "failures": 0, "outputTokensPerS": tok_s,
            "ttftP50Ms": 200.0, "ttftP99Ms": 900.0, "tpotP50Ms": tpot_ms,
            "tpotP99Ms": 2 * tpot_ms}  # fmt: skip


def field_load(production: int, *, fp8_gains: bool = True) -> dict[str, Any]:
    """A load summary with the field report's shape, at production's concurrency `production`:
    BF16 runs out of KV cache there (an error stage) and made 1,558 tok/s at its best stage;
    FP8 serves it at 2,192 tok/s and is a few percent slower per token where both serve.
    `fp8_gains=False`: both arms serve production's load alike (compute-bound: nothing gained).
    """
    best = 10_000 + production  # a sweep stage other than production's
    control = [_stage(production, 2_000.0 if not fp8_gains else None), _stage(best, 1_558.0)]
    candidate = [_stage(production, 2_010.0 if not fp8_gains else 2_192.0),
                 _stage(best, 1_520.0, tpot_ms=20.6)]  # fmt: skip
    return {
        "kind": "kvgate.load/summary",
        "verdict": "measured" if not fp8_gains else "partial",
        "productionConcurrency": production,
        "promptTokens": 512,
        "outputTokens": 128,
        "numWorkers": 1,
        "control": {"url": "http://control:8000", "exitCode": 0, "stages": control},
        "candidate": {"url": "http://candidate:8000", "exitCode": 0, "stages": candidate},
    }


def load_error_summary(production: int) -> dict[str, Any]:
    """What `kvgate load-job` prints (exit 4) when an arm is unreachable: every stage an error."""
    stages = [_stage(production, None)]
    return {
        "kind": "kvgate.load/summary", "verdict": "error", "productionConcurrency": production,
        "error": "control measured nothing: connection refused",
        "control": {"error": "connection refused", "stages": stages},
        "candidate": {"stages": [_stage(production, 2_192.0)]},
    }  # fmt: skip


class Crash(BaseException):
    """The operator process dies here (SIGKILL): nothing after it runs, status is not written."""


def deployment(name: str = "vllm") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ns", "generation": 1, "uid": "dep-uid"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "command": ["vllm", "serve", "Qwen/Qwen3-8B"],
                            "args": ["--port", "8000", "--max-model-len", "8192"],
                            "env": [{"name": "HF_HOME", "value": "/cache"}],
                            # kvgate reads a canary's startup log once it is Ready
                            # (`kvgate.judge.target`: a target without it is invalid)
                            "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}},
                        }
                    ]
                },
            },
        },
        "status": {},
    }


def image_id(image: str, epoch: int = 0) -> str:
    """A pulled image by digest, as containerStatuses[].imageID shows it."""
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"docker.io/{repo}@sha256:{hashlib.sha256(f'{image}/{epoch}'.encode()).hexdigest()}"


def gpu_node(name: str, product: str | None) -> dict[str, Any]:
    """A Node as GPU feature discovery labels it (no product: a node without the label)."""
    labels = {"kubernetes.io/hostname": name}
    if product is not None:
        labels["nvidia.com/gpu.product"] = product
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKube:
    """The operator's view of a cluster that does what it is told, at once."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests = 0
        self.mutations = 0
        self.crash_at: int | None = None
        self.crash_after = False  # crash after applying the mutation instead of before
        self.refuse_patches: Callable[[list[dict[str, Any]]], str | None] = lambda ops: None
        self.crash_new_pods = False
        # Secrets by name (kubernetes V1Secret), read through the real adapter's hub-token rule
        self.secrets: dict[str, Any] = {}
        # The L4 trap: a candidate without the Triton backend dies building FlashInfer's kernels
        self.jit_crash = False
        # A candidate canary that crashes printing this log (a failure kvgate does not classify)
        self.canary_crash_log: str | None = None
        self.eval_summary: dict[str, Any] = dict(SUMMARY_PASS)
        self.eval_log_before = ""  # lines the eval pod logs before its summary
        self.hold_evals = False  # eval Jobs run (log `eval_log_before` only) until finish_evals()
        self.on_mutation: Callable[[FakeKube], None] | None = None
        # The load Job: its pod logs `load_summary(production concurrency asked)` with the
        # attempt's nonce as its last line; a Job whose summary is not `measured` fails (kvgate
        # load-job exits 3 or 4). `load_summary` returning None: the Job fails logging nothing
        # (killed, OOM). `load_nonce=False`: the summary line carries no nonce.
        self.load_summary: Callable[[int], dict[str, Any] | None] = field_load
        self.load_nonce = True
        # `hold_loads`: load Jobs stay running, their pod logging `load_log` (progress lines),
        # until fail_loads() ends them as the Job controller does at activeDeadlineSeconds.
        self.hold_loads = False
        self.extra_metrics = ""  # appended to every pod's /metrics (e.g. length histograms)
        self.load_log = ""
        self.load_concurrency: list[int] = []  # --production-concurrency of each load Job
        # cache_config_info of each log's engine: what its /metrics say (a test may lie here)
        self.registry_epoch = 0  # bumped by `retag`
        self.cache_info = {CONTROL_LOG: ("auto", 1806), CANDIDATE_LOG: ("fp8_e4m3", 3804)}
        # Pods are scheduled to `node` (a Node object the test may `add`, labelled by GPU
        # feature discovery: `gpu_node`); `forbid_nodes`: reading a Node answers 403.
        self.node = "gpu-node-1"
        self.forbid_nodes = False
        self._ids = itertools.count(1)

    # --- helpers for tests ---

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("uid", f"uid-{next(self._ids)}")
        obj["metadata"].setdefault("namespace", "ns")
        self.objects[(obj["kind"], obj["metadata"]["name"])] = obj
        if obj["kind"] == "Deployment":
            self._roll_out(obj)
        return obj

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def container(self, name: str = "vllm") -> dict[str, Any]:
        dep = self.objects[("Deployment", name)]
        return dict(dep["spec"]["template"]["spec"]["containers"][0])

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for (k, _), o in self.objects.items() if k == kind]

    def scrape(self, url: str, timeout: float) -> str:
        """The /metrics of the pod at the URL's address: cache_config_info agrees with its log."""
        host = url.split("//", 1)[-1].split(":", 1)[0]
        pod = next(
            (p for p in self.of_kind("Pod") if p.get("status", {}).get("podIP") == host), None
        )
        if pod is None:
            raise ScrapeError(url, "connection refused")
        dtype, blocks = self.cache_info.get(str(pod.get("_log")), ("auto", 1806))
        line = re.sub(r'cache_dtype="[^"]*"', f'cache_dtype="{dtype}"', _CACHE_INFO)
        line = re.sub(r'num_gpu_blocks="[^"]*"', f'num_gpu_blocks="{blocks}"', line)
        return METRICS.replace(_CACHE_INFO, line) + self.extra_metrics

    # --- fault injection ---

    def _mutate(self, apply: Callable[[], Any]) -> Any:
        self.mutations += 1
        crash = self.crash_at is not None and self.mutations == self.crash_at
        if crash and not self.crash_after:
            raise Crash(f"before mutation {self.mutations}")
        result = apply()
        if self.on_mutation is not None:
            self.on_mutation(self)
        if crash:
            raise Crash(f"after mutation {self.mutations}")
        return result

    # --- the Kube interface ---

    def _read(self, kind: str, name: str) -> dict[str, Any] | None:
        self.requests += 1
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj is not None else None

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read("Deployment", name)

    def read_node(self, name: str) -> dict[str, Any] | None:
        if self.forbid_nodes:  # the chart's ClusterRole without `get` on nodes
            self.requests += 1
            raise KubeError(f"get node {name}: 403 Forbidden", status=403)
        return self._read("Node", name)

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read("Job", name)

    def read_network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read("NetworkPolicy", name)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.requests += 1
        return [
            copy.deepcopy(p)
            for p in self.of_kind("Pod")
            if _matches(p["metadata"].get("labels") or {}, selector)
        ]

    def list_rollouts(self, namespace: str) -> list[dict[str, Any]]:
        return []

    def read_log(
        self, namespace: str, pod: str, container: str | None = None, *, previous: bool = False
    ) -> str | None:
        self.requests += 1
        obj = self.objects.get(("Pod", pod))
        return None if obj is None or previous else str(obj.get("_log", ""))

    def read_secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """The real `Kube.read_secret_value` (label, key, one line), over this cluster's Secrets."""
        return self._secret_reader().read_secret_value(namespace, name, key)

    def add_secret(
        self,
        name: str,
        value: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        import base64

        from kubernetes import client as k8s

        data = {"token": base64.b64encode(value.encode()).decode()}
        meta = k8s.V1ObjectMeta(name=name, namespace="ns", labels=labels, annotations=annotations)
        self.secrets[name] = k8s.V1Secret(metadata=meta, data=data)

    def _secret_reader(self) -> Any:
        """The real `Kube` (its Secret rules), reading this cluster's Secrets; one request."""
        from types import SimpleNamespace

        from kubernetes import client as k8s
        from kubernetes.client.exceptions import ApiException

        from kvgate.adapters.kube import Kube

        self.requests += 1

        def read(secret_name: str, secret_namespace: str) -> Any:
            if secret_name not in self.secrets:
                raise ApiException(status=404, reason="NotFound")
            return self.secrets[secret_name]

        real = Kube(k8s.ApiClient())
        real.core = SimpleNamespace(read_namespaced_secret=read)  # type: ignore[assignment]
        return real

    def check_hub_token_secret(self, namespace: str, name: str, key: str) -> None:
        """The real `Kube.check_hub_token_secret`, over this cluster's Secrets."""
        self._secret_reader().check_hub_token_secret(namespace, name, key)

    def read_forge_token(
        self, namespace: str, name: str, key: str, *, api_url: str, repository: str
    ) -> str:
        """The real `Kube.read_forge_token`, over this cluster's Secrets."""
        token: str = self._secret_reader().read_forge_token(
            namespace, name, key, api_url=api_url, repository=repository
        )
        return token

    def ensure(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """As the adapter: the object this created (True) or the one with the name (False)."""
        self.requests += 1
        existing = self.objects.get((body["kind"], body["metadata"]["name"]))
        if existing is not None:
            self.requests += 1  # the adapter's GET after the 409
            return copy.deepcopy(existing), False
        return copy.deepcopy(self._mutate(lambda: self._create(body))), True

    def _create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = self.add(dict(body))
        if obj["kind"] == "Pod":
            self._start(obj)
        elif obj["kind"] == "Job":
            obj["status"] = {"active": 1} if self.hold_evals else copy.deepcopy(_JOB_DONE)
            labels = {
                **obj["spec"]["template"]["metadata"]["labels"],
                "job-name": obj["metadata"]["name"],
            }
            pod = self.add({"kind": "Pod", "metadata": {"name": f"{obj['metadata']['name']}-x", "labels": labels},
                            "spec": obj["spec"]["template"]["spec"]})  # fmt: skip
            pod["status"] = {"phase": "Succeeded"}
            env = {
                e["name"]: e.get("value")
                for e in obj["spec"]["template"]["spec"]["containers"][0].get("env") or []
            }
            if labels.get("kvgate.io/arm") == "load":
                self._start_load(obj, pod, env)
                return obj
            summary = {**self.eval_summary, "nonce": env.get("KVGATE_EVAL_NONCE")}
            pod["_summary"] = json.dumps(summary) + "\n"
            pod["_log"] = self.eval_log_before + ("" if self.hold_evals else pod["_summary"])
        return obj

    def _start_load(self, job: dict[str, Any], pod: dict[str, Any], env: dict[str, Any]) -> None:
        """The load Job runs to its end at once: its log, then Complete or Failed by the summary."""
        command = [str(a) for a in job["spec"]["template"]["spec"]["containers"][0]["command"]]
        production = int(command[command.index("--production-concurrency") + 1])
        self.load_concurrency.append(production)
        if self.hold_loads:
            job["status"] = {"active": 1}
            pod["status"] = {"phase": "Running"}
            pod["_log"] = self.load_log
            return
        summary = self.load_summary(production)
        progress = json.dumps({"kind": "kvgate.load/progress", "arm": "control", "stage": 1})
        pod["_log"] = progress + "\n"
        if summary is None:
            job["status"] = copy.deepcopy(_JOB_FAILED)
            return
        if self.load_nonce:
            summary = {**summary, "nonce": env.get("KVGATE_LOAD_NONCE")}
        pod["_log"] += json.dumps(summary) + "\n"
        ok = summary.get("verdict") == "measured"
        job["status"] = copy.deepcopy(_JOB_DONE if ok else _JOB_FAILED)

    def log_loads(self, text: str) -> None:
        """Every running load Job's pod logs `text` too."""
        for job in self.of_kind("Job"):
            role = job["spec"]["template"]["metadata"]["labels"].get("kvgate.io/arm")
            if role == "load" and job["status"] == {"active": 1}:
                for pod in self.list_pods("", f"job-name={job['metadata']['name']}"):
                    self.objects[("Pod", pod["metadata"]["name"])]["_log"] += text

    def fail_loads(self, reason: str = "DeadlineExceeded") -> None:
        """Every running load Job fails now, its log unchanged (no summary): the Job controller
        killing it at its activeDeadlineSeconds."""
        for job in self.of_kind("Job"):
            role = job["spec"]["template"]["metadata"]["labels"].get("kvgate.io/arm")
            if role == "load" and job["status"] == {"active": 1}:
                job["status"] = {
                    "failed": 1,
                    "conditions": [{"type": "Failed", "status": "True", "reason": reason,
                                    "message": "Job was active longer than specified deadline"}],
                }  # fmt: skip

    def finish_evals(self) -> None:
        """Every running eval Job completes now: its pod logs the summary, the Job is Complete."""
        self.hold_evals = False
        for job in self.of_kind("Job"):
            role = job["spec"]["template"]["metadata"]["labels"].get("kvgate.io/arm")
            if job["status"] != _JOB_DONE and role == "eval":
                job["status"] = copy.deepcopy(_JOB_DONE)
                for pod in self.list_pods("", f"job-name={job['metadata']['name']}"):
                    self.objects[("Pod", pod["metadata"]["name"])]["_log"] += pod["_summary"]

    def _start(self, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        candidate = "--kv-cache-dtype" in (container.get("args") or [])
        pod["_log"] = CANDIDATE_LOG if candidate else CONTROL_LOG
        labels = pod["metadata"].get("labels") or {}
        crashed = candidate and self.crash_new_pods and "kvgate.io/rollout" not in labels
        args = container.get("args") or []
        triton = any(
            args[i : i + 2] == ["--attention-backend", "TRITON_ATTN"] for i in range(len(args))
        )
        if candidate and self.jit_crash and not triton:
            pod["_log"] = JIT_FAILED_LOG
            crashed = True
        if candidate and self.canary_crash_log is not None and "kvgate.io/rollout" in labels:
            pod["_log"] = self.canary_crash_log
            crashed = True
        # An engine given a fingerprint instead of a value (status copied into a pod) fails.
        env = container.get("env") or []
        crashed = crashed or any(str(e.get("value", "")).startswith("sha256:") for e in env)
        state: dict[str, Any] = {"running": {}}
        pod["spec"]["nodeName"] = self.node
        pod["status"] = {
            "phase": "Running",
            "podIP": f"127.0.0.{next(self._ids) % 250 + 2}",
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image"),
                    # the registry's answer for the tag now: `retag()` moves it to new content
                    "imageID": image_id(str(container.get("image")), self.registry_epoch),
                    "ready": not crashed,
                    "restartCount": 1 if crashed else 0,
                    "state": state,
                    "lastState": {"terminated": {"exitCode": 1}} if crashed else {},
                }
            ],
        }

    def replace_configmap(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.requests += 1
        return copy.deepcopy(self._mutate(lambda: self.add(dict(body))))

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.requests += 1
        obj = self.objects.get((kind, name))
        if obj is None:
            return False
        if uid and obj["metadata"].get("uid") != uid:
            return False

        def apply() -> bool:
            self.objects.pop((kind, name), None)
            if kind == "Job":
                for pod in self.of_kind("Pod"):
                    if (pod["metadata"].get("labels") or {}).get("job-name") == name:
                        self.objects.pop(("Pod", pod["metadata"]["name"]), None)
            return True

        return bool(self._mutate(apply))

    def patch_deployment(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests += 1
        refusal = self.refuse_patches(ops)
        if refusal is not None:
            raise KubeError(f"patch deployment {namespace}/{name}: {refusal}", status=403)

        def apply() -> dict[str, Any]:
            dep = self.objects[("Deployment", name)]
            try:
                patched = jsonpatch.apply_patch(dep, ops)
            except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as exc:
                raise KubeError(
                    f"patch deployment {namespace}/{name}: 422 {exc}", status=422
                ) from exc
            if patched["spec"]["template"] != dep["spec"]["template"]:
                patched["metadata"]["generation"] = int(dep["metadata"]["generation"]) + 1
            self.objects[("Deployment", name)] = patched
            self._roll_out(patched)
            return copy.deepcopy(patched)

        return dict(self._mutate(apply))

    def retag(self, name: str = "vllm") -> None:
        """The image's tag now names other content (a re-pushed tag); the pods roll over."""
        self.registry_epoch += 1
        self._roll_out(self.objects[("Deployment", name)])

    def reschedule(self, node: str, name: str = "vllm") -> None:
        """The production pods move to `node` (drained, autoscaled): same template, same image."""
        self.node = node
        self._roll_out(self.objects[("Deployment", name)])

    def edit_container(self, name: str, **fields: Any) -> None:
        """Someone else edits the Deployment (kubectl, Argo CD): not an operator mutation."""
        dep = self.objects[("Deployment", name)]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        for key, value in fields.items():
            if value is None:
                container.pop(key, None)
            else:
                container[key] = copy.deepcopy(value)
        dep["metadata"]["generation"] += 1
        self._roll_out(dep)

    def _roll_out(self, dep: dict[str, Any]) -> None:
        """The Deployment controller, instantly: one new pod of the template, the old ones gone."""
        name = dep["metadata"]["name"]
        labels = dict(dep["spec"]["selector"]["matchLabels"])
        for pod in self.of_kind("Pod"):
            if _matches(pod["metadata"].get("labels") or {}, f"app={labels['app']}") and not (
                pod["metadata"].get("labels") or {}
            ).get("kvgate.io/rollout"):
                self.objects.pop(("Pod", pod["metadata"]["name"]), None)
        generation = dep["metadata"]["generation"]
        pod = {
            "kind": "Pod",
            "metadata": {"name": f"{name}-{generation}", "labels": labels},
            "spec": copy.deepcopy(dep["spec"]["template"]["spec"]),
        }
        pod = self.add(pod)
        self._start(pod)
        ready = int(pod["status"]["containerStatuses"][0]["ready"])
        dep["status"] = {
            "observedGeneration": generation,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": 1 - ready,
        }
