"""manifests: deterministic names, canary pods invisible to Services, the eval Job, the patch."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvgate.change import container as promotion
from kvgate.change import manifests as m
from kvgate.spec.rollout import RolloutSpec

CONTAINER: dict[str, Any] = {
    "name": "engine",
    "image": "vllm/vllm-openai:v0.11.0",
    "command": ["python", "-m", "kvgate.sim", "vllm", "serve", "Qwen/Qwen3-8B"],
    "args": ["--port", "8000"],
    "env": [{"name": "KVGATE_SIM_GPU", "value": "L4"}],
}
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "qwen"}, "annotations": {"team": "ml"}},
    "spec": {"containers": [CONTAINER], "restartPolicy": "Always"},
}
SPEC = RolloutSpec.from_dict(
    {
        "targetRef": {"name": "qwen"},
        "extraArgs": ["--attention-backend", "TRITON_ATTN"],
        "extraEnv": [{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"}],
        "gates": {"accuracy": {"questions": 200, "chunk": 50, "margin": 2}},
    }
)


@pytest.mark.parametrize(
    ("rollout", "arm", "name"),
    [("qwen-fp8", "control", "qwen-fp8-control"), ("qwen-fp8", "candidate", "qwen-fp8-candidate")],
)
def test_canary_names(rollout: str, arm: str, name: str) -> None:
    assert m.canary_name(rollout, arm) == name


def test_long_names_are_shortened_deterministically() -> None:
    long = "a" * 80
    names = [m.canary_name(long, "candidate"), m.eval_job_name(long, 12), m.report_name(long)]
    assert all(len(n) <= 63 for n in names)
    assert names == [
        m.canary_name(long, "candidate"),
        m.eval_job_name(long, 12),
        m.report_name(long),
    ]
    assert m.canary_name(long, "control") != m.canary_name("a" * 81, "control")


def test_bad_arm_and_attempt_are_refused() -> None:
    with pytest.raises(ValueError, match="arm 'prod' is not one of control, candidate"):
        m.canary_name("r", "prod")
    with pytest.raises(ValueError, match="eval attempt 0 is outside"):
        m.eval_job_name("r", 0)


def test_canary_pod_replaces_labels_and_never_restarts() -> None:
    before = copy.deepcopy(TEMPLATE)
    pod = m.build_canary_pod(
        rollout="qwen-fp8",
        namespace="ns",
        arm="candidate",
        template=TEMPLATE,
        container_index=0,
        container=m.candidate_container(SPEC, CONTAINER),
        config_hash="abc",
    )
    assert pod["metadata"]["labels"] == {
        "kvgate.io/rollout": "qwen-fp8",
        "kvgate.io/arm": "candidate",
        "app.kubernetes.io/managed-by": "kvgate",
    }
    assert "app" not in pod["metadata"]["labels"]  # production Services select app=qwen
    assert pod["metadata"]["annotations"] == {"team": "ml", "kvgate.io/config-hash": "abc"}
    assert pod["spec"]["restartPolicy"] == "Never"
    c = pod["spec"]["containers"][0]
    assert c["args"] == [
        "--port",
        "8000",
        "--kv-cache-dtype",
        "fp8",
        "--attention-backend",
        "TRITON_ATTN",
    ]
    assert {"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"} in c["env"]
    assert before == TEMPLATE  # the input is not modified


def test_eval_job() -> None:
    cmd = m.eval_command(
        SPEC,
        control_url="http://127.0.0.2:8000/v1/completions",
        candidate_url="http://127.0.0.3:8000/v1/completions",
        model="Qwen/Qwen3-8B",
        concurrency=8,
    )
    assert cmd == [
        "kvgate", "eval",
        "--control-url", "http://127.0.0.2:8000/v1/completions",
        "--candidate-url", "http://127.0.0.3:8000/v1/completions",
        "--task", "gsm8k", "--limit", "200", "--num-fewshot", "5",
        "--margin", "0.02", "--confidence", "0.95", "--concurrency", "8",
        "--sequential", "--chunk", "50", "--model", "Qwen/Qwen3-8B",
    ]  # fmt: skip
    job = m.build_eval_job(
        rollout="r", namespace="ns", attempt=2, image="img", command=cmd,
        env={"KVGATE_GSM8K_DIR": "/data"}, resources={}, deadline_s=600, config_hash="abc",
    )  # fmt: skip
    assert job["metadata"]["name"] == "r-eval-2"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 600
    assert job["spec"]["template"]["metadata"]["labels"]["kvgate.io/attempt"] == "2"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "KVGATE_GSM8K_DIR", "value": "/data"}]
    assert "resources" not in container
    pod = job["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod  # the namespace's default unless the operator says


def _restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Pod Security `restricted` checks (v1.37) a pod spec fails, by name."""
    bad = []
    psc = pod.get("securityContext") or {}
    for c in pod["containers"]:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append("allowPrivilegeEscalation != false")
        if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
            bad.append("unrestricted capabilities")
        if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append("capabilities added")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            bad.append("runAsNonRoot != true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append("runAsUser=0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append("seccompProfile")
        if sc.get("privileged"):
            bad.append("privileged")
    for v in pod.get("volumes") or []:
        if set(v) - {"name"} - {"emptyDir", "configMap", "secret", "projected", "downwardAPI",
                                "persistentVolumeClaim", "ephemeral", "csi"}:  # fmt: skip
            bad.append(f"volume {v['name']}")
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        bad.append("host namespaces")
    return bad


def test_eval_job_is_locked_down() -> None:
    job = m.build_eval_job(
        rollout="r", namespace="ns", attempt=1, image="img@sha256:" + "a" * 64,
        command=["kvgate", "eval"], env={"PYTHONUNBUFFERED": "1"}, resources={"limits": {"cpu": "2"}},
        deadline_s=60, config_hash="abc", service_account_name="kvgate-eval", nonce="n0nce",
    )  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert _restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "kvgate-eval"
    assert pod["enableServiceLinks"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsUser"] == 65532 != 0
    # HOME, HF_HOME and lm-eval's scratch live under /tmp (Dockerfile): the one writable path
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    assert {"name": "KVGATE_EVAL_NONCE", "value": "n0nce"} in c["env"]
    assert (c["terminationMessagePath"], c["terminationMessagePolicy"]) == (
        "/dev/termination-log",
        "File",
    )
    assert c["resources"] == {"limits": {"cpu": "2"}}
    assert c["image"] == "img@sha256:" + "a" * 64


def test_eval_job_without_writable_tmp_and_nonce_override() -> None:
    job = m.build_eval_job(
        rollout="r", namespace="ns", attempt=1, image="img", command=["kvgate", "eval"],
        env={"KVGATE_EVAL_NONCE": "from-env"}, resources={}, deadline_s=60, config_hash="abc",
        nonce="wins", writable_tmp=False,
    )  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "volumes" not in pod and "volumeMounts" not in c
    assert c["env"] == [{"name": "KVGATE_EVAL_NONCE", "value": "wins"}]
    assert _restricted_violations(pod) == []


def test_restricted_check_catches_a_root_pod() -> None:
    # The checker above is only worth something if it fails on what restricted refuses.
    job = m.build_eval_job(
        rollout="r", namespace="ns", attempt=1, image="img", command=["x"], env={},
        resources={}, deadline_s=60, config_hash="abc",
    )  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"] = {"runAsUser": 0}
    pod["securityContext"] = {}
    assert set(_restricted_violations(pod)) == {
        "allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
        "runAsUser=0", "seccompProfile",
    }  # fmt: skip


def test_patch_sets_candidate_and_revert_restores() -> None:
    # promotion.patch_ops is the patch act.py sends (the older build_container_patch is gone)
    candidate = m.container_config(m.candidate_container(SPEC, CONTAINER))
    ops = promotion.patch_ops(0, CONTAINER, candidate)
    assert ops[0] == {
        "op": "test",
        "path": "/spec/template/spec/containers/0/name",
        "value": "engine",
    }
    assert [o["path"].rsplit("/", 1)[1] for o in ops if o["op"] != "test"] == ["args", "env"]
    promoted = _apply(CONTAINER, ops)
    back = promotion.patch_ops(0, promoted, m.container_config(CONTAINER))
    assert _apply(promoted, back) == CONTAINER
    # nothing to change: no patch at all (build_container_patch sent the bare name test)
    assert promotion.patch_ops(0, CONTAINER, m.container_config(CONTAINER)) == []


def test_revert_removes_keys_that_were_absent() -> None:
    bare = {"name": "engine", "command": ["vllm", "serve", "m"]}
    wanted = {"command": ["vllm", "serve", "m"], "args": ["--kv-cache-dtype", "fp8"]}
    ops = promotion.patch_ops(0, bare, wanted)
    assert ops[1] == {
        "op": "add",
        "path": "/spec/template/spec/containers/0/args",
        "value": ["--kv-cache-dtype", "fp8"],
    }
    back = promotion.patch_ops(0, _apply(bare, ops), m.container_config(bare))
    assert back[-1] == {"op": "remove", "path": "/spec/template/spec/containers/0/args"}


def _apply(container: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A tiny JSON-patch applier for one container (test, add, replace, remove)."""
    out = copy.deepcopy(container)
    for op in ops:
        key = op["path"].rsplit("/", 1)[1]
        if op["op"] == "test":
            assert out[key] == op["value"]
        elif op["op"] in ("add", "replace"):
            out[key] = op["value"]
        elif op["op"] == "remove":
            del out[key]
    return out


def test_find_container() -> None:
    spec = {"containers": [{"name": "side"}, {"name": "engine"}]}
    assert m.find_container(spec, "engine") == (1, {"name": "engine"})
    assert m.find_container(spec, None) == (0, {"name": "side"})
    with pytest.raises(
        LookupError, match=r"container 'x' not in the pod template \(containers: side, engine\)"
    ):
        m.find_container(spec, "x")


def test_secret_names_finds_every_reference() -> None:
    pod = {
        "kind": "Pod",
        "spec": {
            "initContainers": [{"envFrom": [{"secretRef": {"name": "a"}}, {"configMapRef": {}}]}],
            "containers": [
                {
                    "env": [
                        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "b"}}},
                        {"name": "Y", "value": "c"},
                    ]
                }
            ],
            "volumes": [
                {"name": "v", "secret": {"secretName": "d"}},
                {"name": "t", "emptyDir": {}},
            ],
        },
    }
    assert m.secret_names(pod) == {"a", "b", "d"}
    job = {"kind": "Job", "spec": {"template": {"spec": pod["spec"]}}}
    assert m.secret_names(job) == {"a", "b", "d"}
    assert m.secret_names({"kind": "Job", "spec": {}}) == set()


def test_load_job_is_the_eval_jobs_pod_with_its_own_name_role_and_bounds() -> None:
    cmd = m.load_command(
        control_url="http://127.0.0.2:8000", candidate_url="http://127.0.0.3:8000",
        model="Qwen/Qwen3-8B", production_concurrency=64, prompt_tokens=512, output_tokens=128,
        max_concurrency=128,
    )  # fmt: skip
    job = m.build_load_job(
        rollout="r", namespace="ns", attempt=3, image="img", command=cmd, deadline_s=900,
        config_hash="abc", nonce="n0nce",
    )  # fmt: skip
    eval_job = m.build_eval_job(
        rollout="r", namespace="ns", attempt=3, image="img", command=cmd, env={},
        resources=m.DEFAULT_LOAD_RESOURCES, deadline_s=900, config_hash="abc",
    )  # fmt: skip
    assert job["metadata"]["name"] == "r-load-3"
    assert job["metadata"]["labels"]["kvgate.io/arm"] == "load"
    assert job["spec"]["template"]["metadata"]["labels"]["kvgate.io/attempt"] == "3"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 900
    pod, eval_pod = job["spec"]["template"]["spec"], eval_job["spec"]["template"]["spec"]
    assert _restricted_violations(pod) == []
    (c,), (ec,) = pod["containers"], eval_pod["containers"]
    assert c["name"] == "load" and c["command"] == cmd
    assert c["securityContext"] == ec["securityContext"]
    assert pod["securityContext"] == eval_pod["securityContext"]
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert c["env"] == [{"name": "KVGATE_LOAD_NONCE", "value": "n0nce"}]
    assert c["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "4", "memory": "4Gi"},
    }
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}]
    assert "--num-workers" in cmd and cmd[cmd.index("--num-workers") + 1] == "1"


def test_load_job_names_stay_dns_labels() -> None:
    long = "a" * 63
    assert len(m.load_job_name(long, 99)) <= 63
    assert len(m.eval_job_name(long, 99)) <= 63
    with pytest.raises(ValueError, match="load attempt 0 is outside"):
        m.load_job_name("r", 0)


def test_the_load_command_passes_the_gates_slos_only_when_given() -> None:
    common: dict[str, Any] = {
        "control_url": "http://127.0.0.2:8000", "candidate_url": "http://127.0.0.3:8000",
        "model": "m", "production_concurrency": 8, "prompt_tokens": 512, "output_tokens": 128,
        "max_concurrency": 32,
    }  # fmt: skip
    plain = m.load_command(**common)
    assert not any(a.startswith("--slo") for a in plain)
    both = m.load_command(**common, slo_ttft_ms=2000.0, slo_tpot_ms=52.5)
    assert both[len(plain) :] == ["--slo-ttft-ms", "2000", "--slo-tpot-ms", "52.5"]
    one = m.load_command(**common, slo_tpot_ms=80.0)
    assert one[len(plain) :] == ["--slo-tpot-ms", "80"]
