"""The Kubernetes adapter's reads against a loopback HTTP server speaking as the apiserver: the
raw JSON body is what the operator gets (no client model round trip), a 404 is None, and an
answer that is not JSON is one KubeError naming the read, never a traceback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s

from kvgate.adapters.kube import Kube
from kvgate.adapters.kube_cli import CliKube
from kvgate.errors import InputError, KubeError

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    # a field the client's V1Pod model does not know, and a timestamp as the apiserver writes it
    "metadata": {
        "name": "r-control",
        "namespace": "ns",
        "creationTimestamp": "2026-12-02T10:00:00Z",
    },
    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}]},
    "status": {"phase": "Running", "podIP": "10.0.0.7", "futureField": {"x": 1}},
}
DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "vllm", "namespace": "ns", "creationTimestamp": "2026-12-02T10:00:00Z"},
    "spec": {"replicas": 1, "futureField": {"x": 1}},
}
EVENT = {"kind": "Event", "reason": "Started", "lastTimestamp": "2026-12-02T10:00:00Z"}
LATER = {"kind": "Event", "reason": "Verdict", "lastTimestamp": "2026-12-02T10:05:00Z"}
NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
}
ANSWERS: dict[str, tuple[int, bytes]] = {
    "/api/v1/namespaces/ns/pods/r-control": (200, json.dumps(POD).encode()),
    "/api/v1/namespaces/ns/pods": (200, json.dumps({"kind": "PodList", "items": [POD]}).encode()),
    "/api/v1/namespaces/ns/pods/garbled": (200, b"<html>proxy login</html>"),
    "/api/v1/nodes/gpu-1": (200, json.dumps(NODE).encode()),
    "/apis/apps/v1/namespaces/ns/deployments/vllm": (200, json.dumps(DEPLOYMENT).encode()),
    "/apis/apps/v1/namespaces/ns/deployments/garbled": (200, b"<html>proxy login</html>"),
    "/api/v1/namespaces/ns/services": (403, b'{"kind":"Status","code":403}'),
    "/api/v1/namespaces/ns/persistentvolumeclaims": (
        200,
        json.dumps({"items": [{"metadata": {"name": "models"}}]}).encode(),
    ),
    "/api/v1/namespaces/ns/events": (200, json.dumps({"items": [LATER, EVENT]}).encode()),
    "/apis/kvgate.io/v1alpha1/namespaces/ns/kvcacherollouts/denied": (
        403,
        b'{"kind":"Status","code":403,"message":"kvcacherollouts \\"denied\\" is\\n forbidden"}',
    ),
    "/api/v1/namespaces/ns/configmaps/r-report": (200, b'{"kind":"ConfigMap","data":{}}'),
    "/api/v1/nodes/secret-node": (403, b'{"kind":"Status","code":403,"reason":"Forbidden"}'),
}


# What the apiserver received: (method, path) in order.
SEEN: list[tuple[str, str]] = []
_CONFLICT = b'{"kind":"Status","code":409,"reason":"AlreadyExists"}'


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        SEEN.append(("GET", self.path.split("?")[0]))
        self._answer(*ANSWERS.get(self.path.split("?")[0], (404, b'{"kind":"Status","code":404}')))

    def do_POST(self) -> None:  # a create: the name in the body is taken when ANSWERS has it
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = self.path.split("?")[0]
        SEEN.append(("POST", path))
        taken = f"{path}/{body['metadata']['name']}" in ANSWERS
        self._answer(409, _CONFLICT) if taken else self._answer(201, json.dumps(body).encode())

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        SEEN.append(("PATCH", self.path.split("?")[0]))
        self._answer(200, json.dumps({"kind": "ConfigMap", **json.loads(body)}).encode())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def kube() -> Iterator[Kube]:
    SEEN.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield Kube(k8s.ApiClient(config))
    finally:
        server.shutdown()
        server.server_close()


def test_a_read_is_the_apiservers_json_as_it_is(kube: Kube) -> None:
    assert kube.read_deployment("ns", "vllm") == DEPLOYMENT  # unknown fields and "Z" times kept
    assert kube.list_pods("ns", "kvgate.io/rollout=r") == [POD]
    assert kube.requests == 2


def test_a_missing_object_is_none(kube: Kube) -> None:
    assert kube.read_job("ns", "gone") is None
    assert kube.read_deployment("ns", "gone") is None


def test_an_answer_that_is_not_json_is_one_kube_error(kube: Kube) -> None:
    with pytest.raises(KubeError, match=r"^get deployment ns/garbled: unreadable response: "):
        kube.read_deployment("ns", "garbled")


def test_a_node_is_read_by_name_at_cluster_scope(kube: Kube) -> None:
    assert kube.read_node("gpu-1") == NODE
    assert kube.read_node("gone") is None
    # a 403 is a KubeError carrying the status (the controller reads it as "GPU unknown")
    with pytest.raises(KubeError, match=r"^get node secret-node: 403") as raised:
        kube.read_node("secret-node")
    assert raised.value.status == 403


def test_the_clis_reads_name_what_failed_on_one_line(kube: Kube) -> None:
    cli = CliKube(kube.api)  # the operator's client, with the CLI's reads
    # `kvgate check`: the Deployment, and each list it could not read is None (403 here)
    live = cli.read_target("ns", "vllm")
    assert (live.deployment, live.services) == (DEPLOYMENT, None)
    assert live.claims == {"models": {"metadata": {"name": "models"}}}
    with pytest.raises(InputError, match=r"^deployment ns/gone not found; list them with `kubectl get deploy -n ns`$"):  # fmt: skip
        cli.read_target("ns", "gone")
    # `kvgate get`: the Events oldest first
    assert cli.rollout_events("ns", "r") == [EVENT, LATER]
    # a refusal carries the apiserver's own sentence, on one line
    with pytest.raises(KubeError, match=r'^reading kvcacherollout ns/denied: 403 .*: kvcacherollouts "denied" is forbidden$') as raised:  # fmt: skip
        cli.get_rollout("ns", "denied")
    assert raised.value.status == 403


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}}


def test_a_free_name_is_created_with_one_request_and_a_taken_one_is_read() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    counted: list[tuple[str, str]] = []
    config = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    kube = Kube(k8s.ApiClient(config), on_request=lambda verb, res: counted.append((verb, res)))
    SEEN.clear()
    try:
        # a free name: the POST alone, and the object the apiserver made
        made, created = kube.ensure(_pod("r-candidate"))
        assert created and made["metadata"]["name"] == "r-candidate"
        assert SEEN == [("POST", "/api/v1/namespaces/ns/pods")]
        # a taken name: 409, then the object that holds it (the caller checks whose it is)
        SEEN.clear()
        existing, created = kube.ensure(_pod("r-control"))
        assert not created and existing == POD
        assert SEEN == [("POST", "/api/v1/namespaces/ns/pods"),
                        ("GET", "/api/v1/namespaces/ns/pods/r-control")]  # fmt: skip
        # the report's ConfigMap: created when free, patched (never read first) when taken
        SEEN.clear()
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"report.md": "x"}}
        kube.replace_configmap({**cm, "metadata": {"name": "r2-report", "namespace": "ns"}})
        kube.replace_configmap({**cm, "metadata": {"name": "r-report", "namespace": "ns"}})
        assert SEEN == [("POST", "/api/v1/namespaces/ns/configmaps"),
                        ("POST", "/api/v1/namespaces/ns/configmaps"),
                        ("PATCH", "/api/v1/namespaces/ns/configmaps/r-report")]  # fmt: skip
        # every request is counted by verb and resource
        assert counted == [("create", "pod"), ("create", "pod"), ("get", "pod"),
                           ("create", "configmap"), ("create", "configmap"),
                           ("patch", "configmap")]  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_is_read_once_a_minute_for_every_rollout(
    kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvgate.adapters.kube as adapter

    clock = {"now": 1000.0}
    monkeypatch.setattr(adapter.time, "monotonic", lambda: clock["now"])
    # GIVEN one node read by one rollout's arm
    assert kube.read_node("gpu-1") == NODE
    # WHEN other rollouts ask within the minute, THEN the apiserver is not asked again
    clock["now"] += adapter.NODE_TTL_S - 1
    assert kube.read_node("gpu-1") == NODE and kube.read_node("gone") is None
    assert SEEN == [("GET", "/api/v1/nodes/gpu-1"), ("GET", "/api/v1/nodes/gone")]
    # WHEN the minute is over, THEN it is read again (a relabelled node is seen within a minute)
    clock["now"] += 2
    assert kube.read_node("gpu-1") == NODE
    assert SEEN[-1] == ("GET", "/api/v1/nodes/gpu-1") and len(SEEN) == 3
    # a refusal is never kept: the next read asks again
    for _ in range(2):
        with pytest.raises(KubeError):
            kube.read_node("secret-node")
    assert SEEN[-2:] == [("GET", "/api/v1/nodes/secret-node")] * 2
