"""`kvgate check` and the operator's Pending check (`kvgate.judge.target`): the example
Deployment passes; each broken target is named by one line that says its fix."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate import cli
from kvgate.judge import target as targetcheck

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "vllm-deployment.yaml"


def example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def engine(dep: dict[str, Any]) -> dict[str, Any]:
    return dict(dep["spec"]["template"]["spec"]["containers"][0])


def edit(dep: dict[str, Any], **fields: Any) -> dict[str, Any]:
    out = copy.deepcopy(dep)
    container = out["spec"]["template"]["spec"]["containers"][0]
    for key, value in fields.items():
        if value is None:
            container.pop(key, None)
        else:
            container[key] = value
    return out


def real(dep: dict[str, Any]) -> dict[str, Any]:
    """The example as it would run on a real GPU node (the image's vLLM, one GPU)."""
    return edit(
        dep,
        image="vllm/vllm-openai:v0.11.0",
        command=["vllm", "serve"],
        args=["Qwen/Qwen3-8B", "--port", "8000"],
        resources={"limits": {"nvidia.com/gpu": 1}},
        env=None,
    )


def with_volume(dep: dict[str, Any], volume: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dep)
    out["spec"]["template"]["spec"]["volumes"] = [volume]
    return out


def pvc(name: str, mode: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": [mode]},
    }


MODEL_PVC = {"name": "model", "persistentVolumeClaim": {"claimName": "models"}}
CANARY_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "llm"},
    "spec": {"selector": {"app.kubernetes.io/managed-by": "kvgate"}},
}


def test_the_example_and_its_real_gpu_form_pass_with_nothing_to_fix() -> None:
    for dep in (example(), real(example())):
        result = targetcheck.check(dep)
        assert result.findings == ()
        assert result.problem() is None
    result = targetcheck.check(real(example()))
    assert result.gpus_per_pod == 1
    assert any("needs 2 free from Canary until the verdict" in n for n in result.needs)


# (name, broken Deployment, claims, services, the one error's where, words in its line)
BROKEN: list[
    tuple[str, Callable[[], dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], str, str]
] = [
    (
        "no readiness probe",
        lambda: edit(example(), readinessProbe=None),
        [],
        [],
        "container vllm",
        "no readinessProbe",
    ),
    (
        "engine on loopback",
        lambda: edit(example(), args=["vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1"]),
        [],
        [],
        "container vllm",
        "listens on 127.0.0.1",
    ),
    (
        "sglang without metrics",
        lambda: edit(
            example(), args=["sglang", "--model-path", "Qwen/Qwen3-8B", "--host", "0.0.0.0"]
        ),
        [],
        [],
        "container vllm",
        "only with --enable-metrics",
    ),
    (
        "ReadWriteOncePod model volume",
        lambda: with_volume(example(), MODEL_PVC),
        [pvc("models", "ReadWriteOncePod")],
        [],
        "volume model (PersistentVolumeClaim models)",
        "neither canary can start",
    ),
    (
        "Service selecting the canaries",
        example,
        [],
        [CANARY_SERVICE],
        "Service llm",
        "production traffic would reach them",
    ),
    (
        "no engine",
        lambda: edit(example(), command=["sleep"], args=["infinity"]),
        [],
        [],
        "container vllm",
        "engine not readable",
    ),
    (
        "wrong container",
        lambda: edit(example(), name="server"),
        [],
        [],
        "Deployment vllm",
        "container 'vllm' not in the pod template",
    ),
]


@pytest.mark.parametrize(
    ("dep", "claims", "services", "where", "words"),
    [case[1:] for case in BROKEN],
    ids=[case[0] for case in BROKEN],
)
def test_each_broken_target_gets_one_error_line_with_its_fix(
    dep: Callable[[], dict[str, Any]],
    claims: list[dict[str, Any]],
    services: list[dict[str, Any]],
    where: str,
    words: str,
) -> None:
    container = "vllm" if where == "Deployment vllm" else None
    result = targetcheck.check(
        dep(),
        container=container,
        services=services,
        claims={c["metadata"]["name"]: c for c in claims},
    )
    (error,) = result.errors
    assert error.where == where
    assert words in error.problem
    assert error.fix and "\n" not in error.line()
    assert error.line().startswith(f"error: {where}: ") and "; fix: " in error.line()
    assert words in (result.problem() or "")


@pytest.mark.parametrize(
    ("dep", "claims", "words"),
    [
        (
            with_volume(real(example()), MODEL_PVC),
            [pvc("models", "ReadWriteOnce")],
            "only run on the node that mounts it",
        ),
        (with_volume(real(example()), MODEL_PVC), [], "access mode is unknown"),
        (
            with_volume(real(example()), {"name": "m", "hostPath": {"path": "/models"}}),
            [],
            "hostPath /models",
        ),
        (edit(real(example()), resources=None), [], "no nvidia.com/gpu"),
        (edit(real(example()), args=["/models/qwen3-8b"]), [], "local path /models/qwen3-8b"),
        (
            edit(real(example()), args=["Qwen/Qwen3-8B", "--disable-log-stats"]),
            [],
            "--disable-log-stats",
        ),
        (
            edit(real(example()), livenessProbe={"httpGet": {"path": "/health", "port": 8000}}),
            [],
            "livenessProbe restarts the engine 30s after it starts",
        ),
        (
            edit(real(example()), ports=[{"containerPort": 8000, "hostPort": 8000}]),
            [],
            "hostPort 8000",
        ),
    ],
)
def test_risks_are_warnings_that_do_not_fail_the_check(
    dep: dict[str, Any], claims: list[dict[str, Any]], words: str
) -> None:
    result = targetcheck.check(dep, claims={c["metadata"]["name"]: c for c in claims})
    assert result.errors == ()
    assert [w for w in result.warnings if words in w.problem], result.warnings


def test_a_shared_claim_or_a_startup_probe_is_fine() -> None:
    shared = with_volume(real(example()), MODEL_PVC)
    assert (
        targetcheck.check(shared, claims={"models": pvc("models", "ReadOnlyMany")}).findings == ()
    )
    probes = {
        "startupProbe": {"httpGet": {"path": "/health", "port": 8000}},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8000}},
    }
    assert targetcheck.check(edit(real(example()), readinessProbe=None, **probes)).findings == ()


def test_needs_name_the_gpus_and_the_chart_values() -> None:
    dep = real(example())
    dep["metadata"]["namespace"] = "llm"
    dep["spec"]["replicas"] = 3
    container = dep["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    container["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    ]
    needs = "\n".join(targetcheck.check(dep).needs)
    assert "each canary takes 2 nvidia.com/gpu, so a rollout needs 4 free" in needs
    assert "beside production's 6" in needs
    assert "watch.namespaces includes llm" in needs
    assert "hubTokenSecrets.enabled=true for a gated model, with Secret hf" in needs


# -- the command -------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = cli.main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def write(tmp_path: Path, *docs: dict[str, Any]) -> str:
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_cli_passes_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = run(capsys, "-f", str(EXAMPLE))
    assert (code, err) == (0, "")
    assert lines[0] == "Deployment vllm, container vllm"
    assert lines[-1] == "result: passed"
    assert not [line for line in lines if line.startswith(("error:", "warning:"))]


def test_cli_names_every_problem_once_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = with_volume(edit(example(), readinessProbe=None), MODEL_PVC)
    path = write(tmp_path, broken, pvc("models", "ReadWriteOncePod"), CANARY_SERVICE)
    code, lines, err = run(capsys, "-f", path)
    assert (code, err) == (1, "")
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 3 and all("; fix: " in line for line in errors)
    assert [e.split(": ")[1] for e in errors] == [
        "container vllm",
        "volume model (PersistentVolumeClaim models)",
        "Service llm",
    ]
    assert lines[-1].startswith("result: 3 errors, 0 warnings: fix the errors")
    code, lines, _ = run(capsys, "-f", path, "--json")
    found = json.loads(lines[0])
    assert (code, found["ok"], len(found["findings"])) == (1, False, 3)


@pytest.mark.parametrize(
    ("dep", "claims", "services", "where", "words"),
    [case[1:] for case in BROKEN],
    ids=[case[0] for case in BROKEN],
)
def test_cli_on_each_broken_deployment_names_its_problem_and_fix(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    dep: Callable[[], dict[str, Any]],
    claims: list[dict[str, Any]],
    services: list[dict[str, Any]],
    where: str,
    words: str,
) -> None:
    # issue 40's done-when: `kvgate check` passes the example and names each broken one's problem
    path = write(tmp_path, dep(), *claims, *services)
    container = ["-c", "vllm"] if where == "Deployment vllm" else []
    code, lines, err = run(capsys, "-f", path, *container)
    assert (code, err) == (1, "")
    (error,) = [line for line in lines if line.startswith("error:")]
    assert error.startswith(f"error: {where}: ") and words in error
    problem, fix = error.split("; fix: ", 1)
    assert words in problem and fix.strip()
    assert lines[-1].startswith("result: 1 error, ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [\n", "target.yaml:2: not YAML"),
        ("kind: Service\nmetadata: {name: s}\n", "holds no Deployment (found Service)"),
        ("- 1\n", "holds a list, not a Kubernetes object"),
        ("---\n", "holds no Deployment (found nothing)"),
        (
            "kind: Deployment\nmetadata: {name: a}\n---\nkind: Deployment\nmetadata: {name: b}\n",
            "2 Deployments (a, b); pick one with --deployment NAME",
        ),
        ("a: &x 1\nb: *x\n", "uses YAML aliases"),
        ("- " * 70 + "1\n", "nests deeper than 64 levels"),
    ],
)
def test_cli_bad_files_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "target.yaml"
    path.write_text(text)
    code, lines, err = run(capsys, "-f", str(path))
    assert (code, lines) == (2, [])
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert err.count(str(path)) == 1, err  # the file is named once, not wrapped twice


def test_cli_missing_file_and_no_target_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "-f", str(tmp_path / "absent.yaml"))
    assert code == 2 and err.strip().endswith("absent.yaml: no such file")
    code, _, err = run(capsys)
    assert code == 2 and "give --file FILE (a manifest) or --deployment NAME" in err


def test_cli_picks_one_deployment_of_several(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    other = edit(example(), readinessProbe=None)
    other["metadata"]["name"] = "other"
    path = write(tmp_path, example(), other)
    code, lines, _ = run(capsys, "-f", path, "--deployment", "vllm", "-n", "llm")
    assert code == 0 and any("watch.namespaces includes llm" in line for line in lines)
    assert run(capsys, "-f", path, "--deployment", "other")[0] == 1
    code, _, err = run(capsys, "-f", path, "--deployment", "nope")
    assert code == 2 and "no Deployment 'nope' (found vllm, other)" in err


def test_cli_live_reads_the_cluster_and_says_what_it_could_not_list(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvgate.adapters import kube_cli

    dep = with_volume(example(), MODEL_PVC)
    asked: list[tuple[str, str | None]] = []

    class Cluster:
        def read_target(self, namespace: str, name: str) -> kube_cli.LiveTarget:
            asked.append((name, namespace))
            claims = {"models": pvc("models", "ReadWriteOncePod")}
            return kube_cli.LiveTarget("llm", dep, None, claims)

    monkeypatch.setattr(kube_cli, "for_cli", lambda ns: (Cluster(), ns or "default"))
    code, lines, _ = run(capsys, "--deployment", "vllm", "-n", "llm")
    assert (code, asked) == (1, [("vllm", "llm")])
    assert [line for line in lines if line.startswith("error:")] == [
        "error: volume model (PersistentVolumeClaim models): ReadWriteOncePod: production's pod "
        "holds it, so neither canary can start; fix: serve the model from a ReadOnlyMany or "
        "ReadWriteMany claim, the image, or an emptyDir the pod downloads into"
    ]
    assert "note: could not list the namespace's Services: not checked" in lines


# -- the operator: the same check in Pending ---------------------------------------------------


@pytest.mark.parametrize(
    ("change", "spec", "words"),
    [
        ({"readinessProbe": None}, {}, "no readinessProbe"),
        ({"command": ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B"],
          "args": ["--host", "0.0.0.0", "--port", "8000"]},
         {"kvCacheDtype": "fp8_e4m3", "extraArgs": []}, "only with --enable-metrics"),
    ],
)  # fmt: skip
def test_the_operator_ends_an_invalid_target_in_pending_before_any_pod(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], spec: dict[str, Any], words: str
) -> None:
    from test_controller import World

    world = World(monkeypatch, **spec)
    dep = world.kube.objects[("Deployment", "vllm")]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    for key, value in change.items():
        if value is None:
            container.pop(key)
        else:
            container[key] = value
    world.reconcile()
    status = world.obj["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidTarget"), status["message"]
    assert words in status["message"] and "fix: " in status["message"]
    pods = [p["metadata"]["name"] for p in world.kube.of_kind("Pod")]
    assert pods == ["vllm-1"] and world.kube.of_kind("Job") == []  # production's pod alone


@pytest.mark.parametrize(
    "pod_spec",
    [{"containers": "x"}, {"containers": [None]}, {"containers": [{"name": "a"}], "volumes": "v"}],
)
def test_a_malformed_template_is_a_finding_never_a_crash(pod_spec: dict[str, Any]) -> None:
    dep = {"kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"template": {"spec": pod_spec}}}  # fmt: skip
    result = targetcheck.check(dep, claims={"c": {"spec": {"accessModes": "ReadWriteOncePod"}}})
    assert result.errors
    assert all("\n" not in f.line() for f in result.findings)
