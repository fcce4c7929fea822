"""Manifests the operator creates: canary Pods, the eval and load Jobs, the eval NetworkPolicy, the
Deployment patch, the report.

Builders are pure and deterministic: the same rollout gives the same names and bodies, so a
handler that runs twice (operator restart, retry) creates nothing twice. Owner references are
added by the handler (kopf.adopt), not here.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, NotRequired, TypedDict, Unpack

from kvgate.config import DEFAULT_LOAD_RESOURCES
from kvgate.engines import launch as engines
from kvgate.spec import jobresources
from kvgate.spec.rollout import RolloutSpec, is_local_path
from kvgate.vocabulary import (
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_POLICY_HASH,
    EVAL_NONCE_ENV,
    LABEL_ARM,
    LABEL_ATTEMPT,
    LABEL_ROLLOUT,
    LOAD_NONCE_ENV,
    GateMode,
)

ARMS: Final = ("control", "candidate")
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "kvgate"}
MAX_NAME: Final = 63  # pod names double as hostnames (DNS label)
_SUFFIXES: Final = ("-candidate", "-control", "-report", "-eval-99", "-load-99")
_LONGEST_SUFFIX: Final = max(len(s) for s in _SUFFIXES)


def _base(rollout: str) -> str:
    """The rollout name, shortened with a hash when a suffixed child name would exceed 63."""
    room = MAX_NAME - _LONGEST_SUFFIX
    if len(rollout) <= room:
        return rollout
    digest = hashlib.sha256(rollout.encode()).hexdigest()[:8]
    return f"{rollout[: room - 9].rstrip('-.')}-{digest}"


def canary_name(rollout: str, arm: str) -> str:
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r} is not one of {', '.join(ARMS)}")
    return f"{_base(rollout)}-{arm}"


def eval_job_name(rollout: str, attempt: int) -> str:
    if not 1 <= attempt <= 99:
        raise ValueError(f"eval attempt {attempt} is outside [1, 99]")
    return f"{_base(rollout)}-eval-{attempt}"


def eval_policy_name(rollout: str, role: str = "eval") -> str:
    """The eval (or load) Job's NetworkPolicy: one per rollout, for every attempt's Job."""
    return f"{_base(rollout)}-{role}"


def report_name(rollout: str) -> str:
    return f"{_base(rollout)}-report"


def child_labels(rollout: str, arm: str) -> dict[str, str]:
    """Labels of every child: no production Service selects them."""
    return {LABEL_ROLLOUT: rollout, LABEL_ARM: arm, **MANAGED_BY}


def _object(
    api_version: str,
    kind: str,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    **body: Any,
) -> dict[str, Any]:
    """A namespaced object of kvgate's: its metadata, then `body` (spec, data)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **body}


def find_container(pod_spec: Mapping[str, Any], name: str | None) -> tuple[int, dict[str, Any]]:
    """(index, container) of `name`, or of the only/first container when `name` is None."""
    containers = list(pod_spec.get("containers") or [])
    if not containers:
        raise LookupError("the pod template has no containers")
    if name is None:
        return 0, dict(containers[0])
    for i, c in enumerate(containers):
        if c.get("name") == name:
            return i, dict(c)
    names = ", ".join(str(c.get("name")) for c in containers)
    raise LookupError(f"container {name!r} not in the pod template (containers: {names})")


def candidate_container(
    spec: RolloutSpec,
    container: Mapping[str, Any],
    *,
    remedy: tuple[Sequence[str], Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """The production container rewritten with the candidate dtype, args and env.

    `remedy` (args, env), from `engine_versions.remedy_for`, is applied last: its flags and
    variables win over the spec's (a remedied candidate after a known crash).
    """
    candidate = engines.rewrite_container(
        container,
        kv_cache_dtype=spec.kv_cache_dtype,
        engine_version=spec.kv_cache.engine_version,  # else the image tag's version
        extra_args=[*spec.extra_args, *spec.kv_cache.candidate_args()],
        extra_env={e.name: e.value for e in spec.extra_env} or None,
    )
    if remedy is None:
        return candidate
    args, env = remedy
    return engines.rewrite_container(
        candidate, kv_cache_dtype=None, extra_args=list(args), extra_env=dict(env) or None
    )


def build_canary_pod(
    *,
    rollout: str,
    namespace: str,
    arm: str,
    template: Mapping[str, Any],
    container_index: int,
    container: Mapping[str, Any],
    config_hash: str,
) -> dict[str, Any]:
    """One arm's Pod from the Deployment's pod template with `container` at `container_index`.

    The template's labels are replaced by kvgate's, so the production Services never route to
    a canary. restartPolicy is Never: one crash is evidence enough, and its log stays readable.
    """
    pod_spec = copy.deepcopy(dict(template.get("spec") or {}))
    containers = list(pod_spec.get("containers") or [])
    containers[container_index] = copy.deepcopy(dict(container))
    pod_spec["containers"] = containers
    pod_spec["restartPolicy"] = "Never"
    annotations = dict((template.get("metadata") or {}).get("annotations") or {})
    annotations[ANNOTATION_CONFIG_HASH] = config_hash
    labels = child_labels(rollout, arm)
    name = canary_name(rollout, arm)
    return _object("v1", "Pod", name, namespace, labels, annotations, spec=pod_spec)


def eval_concurrency(spec: RolloutSpec, default: int) -> int:
    """The eval's fixed concurrency: the speed gate's first level, else the operator default."""
    if spec.speed is not None and spec.speed.concurrency:
        return spec.speed.concurrency[0]
    return default


def eval_command(
    spec: RolloutSpec,
    *,
    control_url: str,
    candidate_url: str,
    model: str | None,
    concurrency: int,
    max_model_len: int | None = None,
    tokenizer: str | None = None,
) -> list[str]:
    """`kvgate eval` against both arms (full completions URLs), with the gate's settings.

    With `spec.gates.accuracy.longContext` the same run does the long-context task (buckets
    from its contextLengths, else up to `max_model_len`; prompts sized with its tokenizer, else
    `tokenizer`, the model's, at its tokenizerRevision); with `spec.gates.divergence` on, the divergence screen too
    (documents of its maxTokens, else just under `max_model_len`).
    """
    acc = spec.accuracy
    cmd = _command(
        "eval",
        {
            "--control-url": control_url,
            "--candidate-url": candidate_url,
            "--task": acc.task,
            "--limit": str(acc.questions),
            "--num-fewshot": str(acc.few_shot),
            "--margin": f"{acc.margin_pp / 100:g}",
            "--confidence": f"{acc.confidence:g}",
            "--concurrency": str(concurrency),
        },
    )
    if acc.sequential:
        cmd += ["--sequential", "--chunk", str(acc.chunk)]
    if model:
        cmd += ["--model", model]
    lc = acc.long_context
    if lc is not None:
        cmd += _flags(
            {
                "--long-context-tasks": ",".join(lc.tasks),
                "--long-context-items": str(lc.items),
                "--long-context-margin": f"{lc.margin_pp / 100:g}",
                "--recovery-floor": f"{lc.recovery_floor:g}",
            }
        )
        if lc.context_lengths:
            cmd += ["--context-lengths", ",".join(str(n) for n in lc.context_lengths)]
        elif max_model_len:
            cmd += ["--max-model-len", str(max_model_len)]
        name = lc.tokenizer or tokenizer
        if name:
            cmd += ["--tokenizer", str(name)]
        if name and lc.tokenizer_revision and not is_local_path(str(name)):
            cmd += ["--tokenizer-revision", lc.tokenizer_revision]
    div = spec.divergence
    if div.mode is not GateMode.OFF:
        cmd += _flags(
            {
                "--divergence-documents": str(div.documents),
                "--divergence-factor": f"{div.factor:g}",
                "--divergence-logprobs": str(div.logprobs),
            }
        )
        doc_tokens = div.max_tokens or max_model_len
        if doc_tokens:
            cmd += ["--divergence-max-tokens", str(doc_tokens)]
    return cmd


EVAL_UID: Final = 65532  # the Dockerfile's kvgate user
TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
EVAL_TMP_SIZE: Final = "1Gi"  # HOME, HF_HOME and the lm-eval work dir (see the Dockerfile)


def secret_names(obj: Mapping[str, Any]) -> set[str]:
    """Every Secret a Pod's or a Job's pod spec names: env, envFrom and volumes."""
    spec = obj.get("spec") or {}
    pod = ((spec.get("template") or {}).get("spec") or {}) if obj.get("kind") == "Job" else spec
    names: set[str] = set()
    for c in [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]:
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                names.add(str(ref.get("name")))
        names.update(
            str(e["secretRef"].get("name")) for e in c.get("envFrom") or [] if e.get("secretRef")
        )
    names.update(
        str(v["secret"].get("secretName")) for v in pod.get("volumes") or [] if v.get("secret")
    )
    return names


# The eval container's resources: the operator's bounds (the chart's evalResources), which the
# rollout's spec.canary.resources may lower but never raise or drop (InputError).
eval_resources = jobresources.eval_resources


class JobFields(TypedDict):
    """What the eval Job and the load Job are both built from (`build_eval_job`'s and
    `build_load_job`'s shared keywords)."""

    rollout: str
    namespace: str
    attempt: int
    image: str
    command: Sequence[str]
    deadline_s: float
    config_hash: str
    service_account_name: NotRequired[str | None]


def build_eval_job(
    *,
    env: Mapping[str, str],
    resources: Mapping[str, Any],
    nonce: str | None = None,
    writable_tmp: bool = True,
    secret_env: Mapping[str, tuple[str, str]] | None = None,
    **job: Unpack[JobFields],
) -> dict[str, Any]:
    """The accuracy Job; one attempt per Job, so a retry is a new name and a clean log.

    The judge runs with nothing to lose: no API token (`automountServiceAccountToken: false`;
    the eval only talks HTTP to the two canary pods), its own ServiceAccount when the operator
    has one (`service_account_name`), and a pod that passes Pod Security `restricted` (non-root
    UID 65532, no privilege escalation, no capabilities, RuntimeDefault seccomp, read-only root
    filesystem with an emptyDir at /tmp for HOME, HF_HOME and lm-eval's scratch files unless
    `writable_tmp` is False). `nonce` becomes `KVGATE_EVAL_NONCE`, so the summary the eval
    writes can be bound to this attempt. The termination message is read from the default
    path, where the eval may write its summary. `secret_env` maps a variable to a Secret's
    (name, key), read by the kubelet (e.g. HF_TOKEN for a gated model's tokenizer); the value
    never appears in the Job.
    """
    return _judge_job(
        "eval",
        env={**env, **({EVAL_NONCE_ENV: nonce} if nonce is not None else {})},
        resources=resources,
        writable_tmp=writable_tmp,
        secret_env=secret_env,
        **job,
    )


def load_job_name(rollout: str, attempt: int) -> str:
    if not 1 <= attempt <= 99:
        raise ValueError(f"load attempt {attempt} is outside [1, 99]")
    return f"{_base(rollout)}-load-{attempt}"


LOAD_TMP_SIZE: Final = "2Gi"  # inference-perf's configs, logs, reports and the tokenizer


def load_command(
    *,
    control_url: str,
    candidate_url: str,
    model: str,
    production_concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    max_concurrency: int,
    server_type: str = "vllm",
    deadline_s: float | None = None,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    tokenizer: str | None = None,
) -> list[str]:
    """`kvgate load-job` against both arms' base URLs with production's workload shape.

    `tokenizer`: the model's source (a directory or a hub repo id), whose tokenizer the clients
    count with where the Job can read it (`kvgate.load.tokenizer`).

    `deadline_s`: the Job's deadline; the runs get `load_run_timeout(deadline_s)` of it, so the
    program still prints its summary before the Job is killed. The SLOs (the gate's p99
    bounds) make inference-perf count each stage's goodput: the requests that met them all."""
    extra: list[str] = []
    if deadline_s is not None:
        extra += ["--timeout", f"{load_run_timeout(deadline_s):g}"]
    for option, bound in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms)):
        if bound is not None:
            extra += [option, f"{bound:g}"]
    if tokenizer:
        extra += ["--tokenizer", tokenizer]
    options = {
        "--control-url": control_url,
        "--candidate-url": candidate_url,
        "--model": model,
        "--server-type": server_type,
        "--production-concurrency": str(production_concurrency),
        "--max-concurrency": str(max_concurrency),
        "--prompt-tokens": str(prompt_tokens),
        "--output-tokens": str(output_tokens),
        "--num-workers": "1",
    }
    return [*_command("load-job", options), *extra]


def _flags(options: Mapping[str, str]) -> list[str]:
    """`--flag value` pairs, in the mapping's order."""
    return [token for pair in options.items() for token in pair]


def _command(subcommand: str, options: Mapping[str, str]) -> list[str]:
    return ["kvgate", subcommand, *_flags(options)]


def load_run_timeout(deadline_s: float) -> float:
    """The inference-perf runs' bound inside a load Job of `deadline_s`: a margin (a tenth, at
    least 60 s, at most half) is left for the tokenizer, the arms' probes and the summary."""
    margin = min(max(60.0, deadline_s / 10), deadline_s / 2)
    return round(deadline_s - margin, 1)


def build_load_job(
    *,
    env: Mapping[str, str] | None = None,
    resources: Mapping[str, Any] = DEFAULT_LOAD_RESOURCES,
    nonce: str | None = None,
    **job: Unpack[JobFields],
) -> dict[str, Any]:
    """The load Job (`kvgate load-job` on both arms), locked down as the eval Job. `nonce` becomes
    `KVGATE_LOAD_NONCE`, which the summary line carries back."""
    return _judge_job(
        "load",
        env={**(env or {}), **({LOAD_NONCE_ENV: nonce} if nonce is not None else {})},
        resources=resources,
        writable_tmp=True,  # inference-perf writes its config, log and reports there
        secret_env=None,
        tmp_size=LOAD_TMP_SIZE,
        **job,
    )


def _judge_job(
    role: str,
    *,
    env: Mapping[str, str],
    resources: Mapping[str, Any],
    writable_tmp: bool,  # stated by each builder: the lock-down is never a default
    secret_env: Mapping[str, tuple[str, str]] | None,
    tmp_size: str = EVAL_TMP_SIZE,
    **job: Unpack[JobFields],
) -> dict[str, Any]:
    """A Job that talks HTTP to the two arms and judges: one attempt per Job, locked down."""
    rollout, attempt = job["rollout"], job["attempt"]
    name = (eval_job_name if role == "eval" else load_job_name)(rollout, attempt)
    labels = {**child_labels(rollout, role), LABEL_ATTEMPT: str(attempt)}
    env_vars = dict(env)
    container: dict[str, Any] = {
        "name": role,
        "image": job["image"],
        "command": list(job["command"]),
        "env": [{"name": k, "value": v} for k, v in sorted(env_vars.items())]
        + [
            {"name": k, "valueFrom": {"secretKeyRef": {"name": ref[0], "key": ref[1]}}}
            for k, ref in sorted((secret_env or {}).items())
            if k not in env_vars
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": EVAL_UID,
            "runAsGroup": EVAL_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }
    if resources:
        container["resources"] = copy.deepcopy(dict(resources))
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no other Services' addresses in its environment
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": EVAL_UID,
            "runAsGroup": EVAL_UID,
            "fsGroup": EVAL_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if account := job.get("service_account_name"):
        pod_spec["serviceAccountName"] = account
    if writable_tmp:
        container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
        pod_spec["volumes"] = [{"name": "tmp", "emptyDir": {"sizeLimit": tmp_size}}]
    job_spec = {
        "backoffLimit": 0,  # kvgate retries itself, with a fresh Job and a counted attempt
        "activeDeadlineSeconds": max(int(job["deadline_s"]), 1),
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    annotations = {ANNOTATION_CONFIG_HASH: job["config_hash"]}
    return _object("batch/v1", "Job", name, job["namespace"], labels, annotations, spec=job_spec)


DNS_PORT: Final = 53
HUB_PORT: Final = 443  # the hub's HTTPS (huggingface.co and its CDN, or HF_ENDPOINT)


def build_eval_network_policy(
    *, rollout: str, namespace: str, canary_port: int, hub: bool, role: str = "eval"
) -> dict[str, Any]:
    """The eval Job's NetworkPolicy: its pods take no ingress, and send only to the two canary
    pods' serving port, to DNS (53, UDP and TCP, any server: the cluster's resolver is not
    selectable portably), and, with `hub`, to HTTPS (443) at any address, since a NetworkPolicy
    selects addresses, not host names. Enforced only by a CNI that implements NetworkPolicy.
    `role` "load": the same policy for the load Job's pods (its own object, `<rollout>-load`).
    """
    selector = {LABEL_ROLLOUT: rollout, LABEL_ARM: role}
    egress: list[dict[str, Any]] = [
        {
            "to": [
                {"podSelector": {"matchLabels": {LABEL_ROLLOUT: rollout, LABEL_ARM: arm}}}
                for arm in ARMS
            ],
            "ports": [{"protocol": "TCP", "port": canary_port}],
        },
        {"ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]},
    ]
    if hub:
        egress.append({"ports": [{"protocol": "TCP", "port": HUB_PORT}]})
    spec = {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress", "Egress"],
            "egress": egress}  # fmt: skip
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    name, labels = eval_policy_name(rollout, role), child_labels(rollout, role)
    annotations = {ANNOTATION_POLICY_HASH: digest}
    return _object(
        "networking.k8s.io/v1", "NetworkPolicy", name, namespace, labels, annotations, spec=spec
    )


def container_config(container: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a container a rollout changes (kept in status for the revert)."""
    return {k: copy.deepcopy(container[k]) for k in ("command", "args", "env") if k in container}


def build_report_configmap(
    *, rollout: str, namespace: str, files: Mapping[str, str]
) -> dict[str, Any]:
    labels = child_labels(rollout, "report")
    return _object("v1", "ConfigMap", report_name(rollout), namespace, labels, data=dict(files))


def status_json(status: Mapping[str, Any]) -> str:
    """The rollout's status as pretty JSON, for the report ConfigMap."""
    return json.dumps(status, indent=2, sort_keys=True, default=str)
