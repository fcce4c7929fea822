"""The local control plane behaves like a real cluster where kvgate depends on it.

Each test drives real controllers (Deployment, ReplicaSet, Job, garbage collector,
namespace, ServiceAccount token) and the process-running test kubelet.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

# The e2e helpers (tests/e2e/support.py) serve the harness tests too: one wait_for.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from support import wait_for

pytestmark = pytest.mark.harness


def py(code: str) -> list[str]:
    """A container command running a Python snippet (python resolves to this venv)."""
    return ["python", "-c", code]


def sim_available() -> bool:
    """kvgate.sim is being built by another part of the project; use it when it imports."""
    if importlib.util.find_spec("kvgate.sim") is None:
        return False
    proc = subprocess.run(
        [sys.executable, "-m", "kvgate.sim", "--help"], capture_output=True, timeout=60, check=False
    )
    return proc.returncode == 0


def server_container(port: int) -> tuple[dict[str, Any], str]:
    """A long-running HTTP server container and the path that answers 200 when ready."""
    if sim_available():
        container = {
            "name": "engine",
            "image": "vllm/vllm-openai:latest",
            "command": ["python", "-m", "kvgate.sim", "vllm", "serve", "Qwen/Qwen3-8B"],
            "args": ["--port", str(port)],
            "env": [
                # An H100 fits Qwen3-8B's full context; the default L4 profile fails at start.
                {"name": "KVGATE_SIM_GPU", "value": "H100"},
                {"name": "KVGATE_SIM_STARTUP_DELAY", "value": "0"},
                {"name": "KVGATE_SIM_SPEED", "value": "0.01"},
            ],
        }
        path = "/v1/models"
    else:
        container = {
            "name": "engine",
            "image": "python:3.11",
            "command": ["python", "-m", "http.server", str(port), "--bind", "$(POD_IP)"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        }
        path = "/"
    container["ports"] = [{"name": "http", "containerPort": port}]
    container["readinessProbe"] = {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": 1,
    }
    return container, path


def pod_body(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": containers, "terminationGracePeriodSeconds": 5, **spec},
    }


@pytest.fixture
def core(cluster: Any) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client())


@pytest.fixture
def apps(cluster: Any) -> client.AppsV1Api:
    return client.AppsV1Api(cluster.api_client())


@pytest.fixture
def batch(cluster: Any) -> client.BatchV1Api:
    return client.BatchV1Api(cluster.api_client())


def container_status(core: client.CoreV1Api, ns: str, pod: str) -> Any:
    statuses = core.read_namespaced_pod(pod, ns).status.container_statuses or []
    return statuses[0] if statuses else None


@pytest.mark.timeout(240)
def test_node_is_ready_and_reachable_with_kubectl(cluster: Any) -> None:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes] == ["kvgate-node"]
    ready = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert not nodes[0]["spec"].get("taints")
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert version["serverVersion"]["gitVersion"] == version["clientVersion"]["gitVersion"]


@pytest.mark.timeout(300)
def test_deployment_pods_become_ready_and_serve_on_their_pod_ips(
    cluster: Any, namespace: str, apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    container, path = server_container(8000)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 5},
            },
        },
    }
    apps.create_namespaced_deployment(namespace, deployment)

    def available() -> bool:
        status = apps.read_namespaced_deployment_status("web", namespace).status
        return status.ready_replicas == 2 and status.available_replicas == 2

    wait_for(available, 180, "deployment web to have 2 available replicas", interval=0.3)
    pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
    assert len(pods) == 2
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2, "each pod gets its own IP"
    for pod in pods:
        ip = ipaddress.ip_address(pod.status.pod_ip)
        assert ip.is_loopback and str(ip) != "127.0.0.1"
        assert pod.metadata.owner_references[0].kind == "ReplicaSet"
        # Same address and port as a client inside a real cluster would use.
        resp = httpx.get(f"http://{pod.status.pod_ip}:8000{path}", timeout=10)
        assert resp.status_code == 200


@pytest.mark.timeout(180)
def test_env_sources_and_pod_ip_reach_the_process(
    cluster: Any, namespace: str, core: client.CoreV1Api
) -> None:
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    )
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"mode": "fast"}}
    )
    names = ["LITERAL", "EXPANDED", "MY_NAME", "MY_NS", "MY_IP", "POD_IP", "TOKEN", "MODE"]
    code = "import json, os, shutil; print(json.dumps({k: os.environ.get(k) for k in %r} | {'py': shutil.which('python')}))"
    env = [
        {"name": "LITERAL", "value": "plain"},
        {"name": "EXPANDED", "value": "$(LITERAL)-x"},
        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
    ]
    body = pod_body(
        "env",
        [{"name": "c", "image": "x", "command": py(code % names), "env": env}],
        restartPolicy="Never",
    )
    core.create_namespaced_pod(namespace, body)
    wait_for(
        lambda: core.read_namespaced_pod("env", namespace).status.phase == "Succeeded",
        90,
        "pod env to succeed",
        interval=0.3,
    )
    pod = core.read_namespaced_pod("env", namespace)
    out = json.loads(core.read_namespaced_pod_log("env", namespace).strip().splitlines()[-1])
    assert out["LITERAL"] == "plain"
    assert out["EXPANDED"] == "plain-x"
    assert out["MY_NAME"] == "env"
    assert out["MY_NS"] == namespace
    assert out["MY_IP"] == out["POD_IP"] == pod.status.pod_ip
    assert out["TOKEN"] == "s3cret"
    assert out["MODE"] == "fast"
    assert Path(out["py"]).parent == Path(sys.executable).parent
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0


@pytest.mark.timeout(180)
def test_crashing_container_goes_into_crashloop_with_previous_logs(
    cluster: Any, namespace: str, core: client.CoreV1Api
) -> None:
    code = "import os, sys; print('crashing', os.environ['HOSTNAME'], flush=True); sys.exit(3)"
    core.create_namespaced_pod(
        namespace, pod_body("crash", [{"name": "c", "image": "x", "command": py(code)}])
    )

    def crashlooping() -> Any:
        cs = container_status(core, namespace, "crash")
        waiting = cs and cs.state.waiting
        if waiting and waiting.reason == "CrashLoopBackOff" and cs.restart_count >= 1:
            return cs
        return None

    cs = wait_for(crashlooping, 90, "CrashLoopBackOff", interval=0.3)
    assert cs.last_state.terminated.exit_code == 3
    assert cs.last_state.terminated.reason == "Error"
    assert cs.ready is False
    pod = core.read_namespaced_pod("crash", namespace)
    assert pod.status.phase == "Running"
    ready = {c.type: c.status for c in pod.status.conditions}
    assert ready["Ready"] == "False"
    previous = core.read_namespaced_pod_log("crash", namespace, container="c", previous=True)
    assert previous == "crashing crash\n"
    kubectl_previous = cluster.kubectl("logs", "-n", namespace, "crash", "--previous").stdout
    assert kubectl_previous == "crashing crash\n"
    # Back-off grows the restart count over time, never resetting while it crashes.
    wait_for(
        lambda: (cs2 := container_status(core, namespace, "crash")) and cs2.restart_count >= 2,
        60,
        "a second restart",
        interval=0.3,
    )


@pytest.mark.timeout(180)
def test_logs_tail_timestamps_follow_and_multiple_containers(
    cluster: Any, namespace: str, core: client.CoreV1Api
) -> None:
    writer = py(
        "import time\nfor i in range(1, 6): print('line', i, flush=True)\n"
        "time.sleep(8)\nprint('late', flush=True)\ntime.sleep(600)"
    )
    probe_peer = py(
        "import os, socket, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        socket.create_connection((os.environ['POD_IP'], 8123), timeout=1).close(); break\n"
        "    except OSError: time.sleep(0.2)\n"
        "else: raise SystemExit(1)\n"
        "print('peer reachable on', os.environ['POD_IP'], flush=True)"
    )
    containers = [
        {"name": "writer", "image": "x", "command": writer},
        {"name": "server", "image": "x", "command": ["python", "-m", "http.server", "8123", "--bind", "$(POD_IP)"],
         "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]},
        {"name": "client", "image": "x", "command": probe_peer},
    ]  # fmt: skip
    core.create_namespaced_pod(namespace, pod_body("logs", containers, restartPolicy="Never"))

    def writer_log() -> str:
        try:
            # The client turns an empty body into None before the first line is written.
            return core.read_namespaced_pod_log("logs", namespace, container="writer") or ""
        except ApiException as exc:
            # 400 "waiting to start" until the kubelet reports the container running.
            assert exc.status == 400, exc
            return ""

    wait_for(lambda: writer_log().count("line") == 5, 90, "5 log lines", interval=0.3)
    tail = core.read_namespaced_pod_log("logs", namespace, container="writer", tail_lines=2)
    full = core.read_namespaced_pod_log("logs", namespace, container="writer")
    assert full.startswith("line 1\nline 2\nline 3\nline 4\nline 5\n")
    # 'late' comes 8 s after line 5; a stalled test run may already see it.
    assert tail == "".join(full.splitlines(keepends=True)[-2:])
    stamped = core.read_namespaced_pod_log("logs", namespace, container="writer", timestamps=True)
    first = stamped.splitlines()[0]
    stamp, _, text = first.partition(" ")
    assert text == "line 1"
    assert stamp.endswith("Z") and "T" in stamp
    # follow streams until the 'late' line written eight seconds after the others.
    resp = core.read_namespaced_pod_log(
        "logs", namespace, container="writer", follow=True, _preload_content=False
    )
    seen = b""
    deadline = time.monotonic() + 30
    for chunk in resp.stream(64):
        seen += chunk
        if b"late" in seen or time.monotonic() > deadline:
            break
    resp.release_conn()
    assert b"line 1\n" in seen and b"late\n" in seen
    # The containers share the pod IP: the client reached the server container there.
    pod = wait_for(
        lambda: (
            (p := core.read_namespaced_pod("logs", namespace))
            and any(s.name == "client" and s.state.terminated for s in p.status.container_statuses)
            and p
        ),
        60,
        "client container to finish",
        interval=0.3,
    )
    statuses = {s.name: s for s in pod.status.container_statuses}
    assert statuses["client"].state.terminated.exit_code == 0
    assert statuses["server"].state.running is not None
    client_log = core.read_namespaced_pod_log("logs", namespace, container="client")
    assert client_log == f"peer reachable on {pod.status.pod_ip}\n"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("logs", namespace, container="writer", previous=True)
    assert err.value.status == 400


@pytest.mark.timeout(180)
def test_liveness_probe_failure_restarts_the_container(
    cluster: Any, namespace: str, core: client.CoreV1Api
) -> None:
    container = {
        "name": "c",
        "image": "x",
        "command": py("import time; print('up', flush=True); time.sleep(600)"),
        "livenessProbe": {
            "exec": {"command": ["python", "-c", "raise SystemExit(1)"]},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    }
    core.create_namespaced_pod(
        namespace, pod_body("live", [container], terminationGracePeriodSeconds=1)
    )
    cs = wait_for(
        lambda: (s := container_status(core, namespace, "live")) and s.restart_count >= 1 and s,
        60,
        "a liveness restart",
        interval=0.3,
    )
    # Killed by SIGTERM from the kubelet: 128 + 15.
    assert cs.last_state.terminated.exit_code == 143


@pytest.mark.timeout(240)
def test_jobs_succeed_and_fail_with_their_exit_codes(
    cluster: Any, namespace: str, batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    def job(name: str, code: str) -> dict[str, Any]:
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "x", "command": py(code)}],
                    }
                },
            },
        }

    batch.create_namespaced_job(namespace, job("ok", "print('done')"))
    batch.create_namespaced_job(namespace, job("bad", "import sys; sys.exit(7)"))

    def condition(name: str, ctype: str) -> bool:
        conds = batch.read_namespaced_job_status(name, namespace).status.conditions or []
        return any(c.type == ctype and c.status == "True" for c in conds)

    wait_for(lambda: condition("ok", "Complete"), 120, "job ok Complete", interval=0.3)
    wait_for(lambda: condition("bad", "Failed"), 120, "job bad Failed", interval=0.3)
    assert batch.read_namespaced_job_status("ok", namespace).status.succeeded == 1
    ok_pod = core.list_namespaced_pod(namespace, label_selector="job-name=ok").items[0]
    assert ok_pod.status.phase == "Succeeded"
    assert core.read_namespaced_pod_log(ok_pod.metadata.name, namespace) == "done\n"
    bad_pod = core.list_namespaced_pod(namespace, label_selector="job-name=bad").items[0]
    assert bad_pod.status.phase == "Failed"
    assert bad_pod.status.container_statuses[0].state.terminated.exit_code == 7


@pytest.mark.timeout(240)
def test_namespace_deletion_finishes_and_kills_pod_processes(cluster: Any) -> None:
    name = f"kvgate-e2e-{secrets.token_hex(4)}"
    marker = f"kvgate-marker-{secrets.token_hex(6)}"
    cluster.kubectl("create", "namespace", name)
    try:
        wait_for(
            lambda: (
                cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0
            ),
            60.0,
            "default ServiceAccount",
            interval=0.3,
        )
        # Ignores SIGTERM, so the kubelet must SIGKILL it after the grace period.
        stubborn = py(
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        )
        body = pod_body("stubborn", [{"name": "c", "image": "x", "command": [*stubborn, marker]}])
        body["spec"]["terminationGracePeriodSeconds"] = 2
        cluster.kubectl("apply", "-n", name, "-f", "-", input=json.dumps(body))
        cluster.kubectl("create", "configmap", "cfg", "-n", name, "--from-literal=a=b")
        wait_for(lambda: _processes_with(marker), 60, "marker process to run", interval=0.3)
    except BaseException:
        cluster.delete_namespace(name)
        raise
    start = time.monotonic()
    assert cluster.delete_namespace(name, wait=90), "namespace deletion did not finish"
    assert time.monotonic() - start < 90
    assert _processes_with(marker) == []


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


@pytest.mark.timeout(180)
def test_rbac_denies_a_service_account_what_its_role_does_not_grant(
    cluster: Any, namespace: str
) -> None:
    ns = namespace
    cluster.kubectl("create", "serviceaccount", "limited", "-n", ns)
    cluster.kubectl("create", "role", "pod-reader", "-n", ns, "--verb=get,list", "--resource=pods")
    cluster.kubectl(
        "create", "rolebinding", "limited-reads", "-n", ns, "--role=pod-reader",
        f"--serviceaccount={ns}:limited",
    )  # fmt: skip
    who = f"system:serviceaccount:{ns}:limited"
    can = cluster.kubectl("auth", "can-i", "list", "pods", "-n", ns, f"--as={who}", check=False)
    cannot = cluster.kubectl(
        "auth", "can-i", "list", "secrets", "-n", ns, f"--as={who}", check=False
    )
    assert (can.stdout.strip(), cannot.stdout.strip()) == ("yes", "no")

    # A real token, signed by the apiserver's service-account key.
    token = cluster.kubectl("create", "token", "limited", "-n", ns, "--duration=10m").stdout.strip()
    cfg = client.Configuration()
    cfg.host = cluster.server
    cfg.ssl_ca_cert = str(Path(cluster.state_dir) / "pki" / "ca.crt")
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    as_sa = client.CoreV1Api(client.ApiClient(cfg))
    assert as_sa.list_namespaced_pod(ns).items == []
    with pytest.raises(ApiException) as denied:
        as_sa.list_namespaced_secret(ns)
    assert denied.value.status == 403
    with pytest.raises(ApiException) as denied_create:
        as_sa.create_namespaced_config_map(ns, {"metadata": {"name": "nope"}})
    assert denied_create.value.status == 403
    with pytest.raises(ApiException) as other_ns:
        as_sa.list_namespaced_pod("default")
    assert other_ns.value.status == 403


@pytest.mark.timeout(180)
def test_garbage_collector_deletes_pods_of_a_deleted_owner(
    cluster: Any, namespace: str, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    sleeper = py("import time; time.sleep(600)")
    for i in range(2):
        body = pod_body(f"owned-{i}", [{"name": "c", "image": "x", "command": sleeper}])
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
        ]
        core.create_namespaced_pod(namespace, body)
    wait_for(
        lambda: (
            all(p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items)
            and len(core.list_namespaced_pod(namespace).items) == 2
        ),
        60,
        "owned pods running",
        interval=0.3,
    )
    core.delete_namespaced_config_map("owner", namespace)
    wait_for(
        lambda: not core.list_namespaced_pod(namespace).items,
        90,
        "GC to delete owned pods",
        interval=0.3,
    )


@pytest.mark.timeout(180)
def test_pod_uses_its_service_account_token_in_cluster(
    cluster: Any, namespace: str, core: client.CoreV1Api
) -> None:
    ns = namespace
    cluster.kubectl("create", "serviceaccount", "reader", "-n", ns)
    cluster.kubectl("create", "role", "pod-reader", "-n", ns, "--verb=get,list", "--resource=pods")
    cluster.kubectl(
        "create", "rolebinding", "reader", "-n", ns, "--role=pod-reader", f"--serviceaccount={ns}:reader"
    )  # fmt: skip
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "files"}, "data": {"greeting": "hello"}}
    )
    code = (
        "from kubernetes import client, config\n"
        "from kubernetes.client.rest import ApiException\n"
        "config.load_incluster_config()\n"
        "api = client.CoreV1Api()\n"
        "ns = open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read()\n"
        "print('pods', len(api.list_namespaced_pod(ns).items))\n"
        "try:\n"
        "    api.list_namespaced_secret(ns)\n"
        "except ApiException as e:\n"
        "    print('secrets', e.status)\n"
        "print('file', open('/etc/kvgate-e2e/greeting').read())\n"
    )
    body = pod_body(
        "incluster",
        [
            {
                "name": "c",
                "image": "x",
                "command": py(code),
                "volumeMounts": [
                    {"name": "files", "mountPath": "/etc/kvgate-e2e", "readOnly": True}
                ],
            }
        ],
        restartPolicy="Never",
        serviceAccountName="reader",
        volumes=[{"name": "files", "configMap": {"name": "files"}}],
    )
    core.create_namespaced_pod(ns, body)
    wait_for(
        lambda: core.read_namespaced_pod("incluster", ns).status.phase in ("Succeeded", "Failed"),
        90,
        "pod incluster to finish",
        interval=0.3,
    )
    out = core.read_namespaced_pod_log("incluster", ns)
    assert out == "pods 1\nsecrets 403\nfile hello\n", out
    assert core.read_namespaced_pod("incluster", ns).status.phase == "Succeeded"


@pytest.mark.timeout(180)
def test_startup_and_tcp_readiness_probes_gate_readiness(
    cluster: Any, namespace: str, core: client.CoreV1Api
) -> None:
    # Listens only after 5 s: not Ready before that, Ready after, never restarted.
    slow_server = py(
        "import os, socket, time\n"
        "time.sleep(5)\n"
        "s = socket.create_server((os.environ['POD_IP'], 8124))\n"
        "print('listening', flush=True)\n"
        "while True: s.accept()[0].close()"
    )
    tcp = {"tcpSocket": {"port": 8124}, "periodSeconds": 1}
    container = {
        "name": "c",
        "image": "x",
        "command": slow_server,
        "startupProbe": {**tcp, "failureThreshold": 30},
        "readinessProbe": tcp,
    }
    core.create_namespaced_pod(namespace, pod_body("slow", [container]))
    early = wait_for(
        lambda: (s := container_status(core, namespace, "slow")) and s.state.running and s,
        60.0,
        "container running",
        interval=0.3,
    )
    assert early.started is False and early.ready is False
    cs = wait_for(
        lambda: (s := container_status(core, namespace, "slow")) and s.ready and s,
        60,
        "Ready",
        interval=0.3,
    )
    assert cs.started is True
    assert cs.restart_count == 0
    assert core.read_namespaced_pod_log("slow", namespace) == "listening\n"
