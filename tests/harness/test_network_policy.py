"""NetworkPolicies ENFORCED on the real node: the eval Job's policy, as the operator builds it.

kube-proxy and the CNI bridge enforce no NetworkPolicy, so this cluster's real node also runs a
policy engine (`Cluster(network_policy=True)`: kube-router's firewall, iptables + ipset, as a
ServiceAccount of its own; hack/containerd_node.py). Pods from the project's operator image
listen on TCP ports and probe each other with `kubectl exec`:

- without a policy, a pod with the eval Job's labels reaches both canaries' serving port, a
  canary's other port and a production pod, and a canary reaches it (so the test can fail);
- with `manifests.build_eval_network_policy` for the rollout applied, it still reaches both
  canaries' serving port, and no longer the canary's other port, the production pod, nor
  does the canary reach it (the policy takes no ingress);
- with the policy deleted, everything is reachable again: the policy, not the engine, blocked;
- the load Job's policy (role "load") and the DNS and hub rules of both: a load pod reaches the
  canaries, a resolver on 53 (UDP and TCP), not production nor a hub on 443; the eval pod of a
  policy built with `hub` reaches the hub on 443; removing the load policy opens production again.

Propagation is asynchronous: the test waits (bounded) for the condition, never for a time.
After teardown the engine's chains and ipsets are gone with the rest of the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from support import CHART, Helm, wait_for  # noqa: E402

import cluster as cluster_mod  # noqa: E402
import containerd_node  # noqa: E402
from kvgate.change import manifests  # noqa: E402
from kvgate.vocabulary import LABEL_ARM, LABEL_ROLLOUT  # noqa: E402

pytestmark = [pytest.mark.harness]

ROLLOUT = "np"
NAMESPACE = "default"
SERVING_PORT = 8000
OTHER_PORT = 9000
EVAL_PORT = 7000
IMAGE = "ghcr.io/kvgate/kvgate:" + (
    next(
        line.split('"')[1]
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
        if line.startswith("version = ")
    )
)
# Accepts on every port it is given and answers "ok" (the image's Python; no extra package);
# a port given as "u<N>" is UDP and answers each datagram with "ok".
LISTEN = """
import select, socket, sys
socks = {}
for port in sys.argv[1:]:
    udp = port.startswith("u")
    s = socket.socket(type=socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(port.lstrip("u"))))
    if not udp:
        s.listen(16)
    socks[s] = udp
print("listening", *sys.argv[1:], flush=True)
while True:
    for s in select.select(list(socks), [], [])[0]:
        if socks[s]:
            _, peer = s.recvfrom(64)
            s.sendto(b"ok", peer)
            continue
        c, _ = s.accept()
        c.sendall(b"ok")
        c.close()
"""
PROBE = """
import socket, sys
ip, port = sys.argv[1], sys.argv[2]
if port.startswith("u"):
    c = socket.socket(type=socket.SOCK_DGRAM)
    c.settimeout(3)
    c.sendto(b"q", (ip, int(port[1:])))
else:
    c = socket.create_connection((ip, int(port)), timeout=3)
print(c.recv(2).decode())
"""


def pod(
    name: str, labels: dict[str, str], ports: tuple[int | str, ...], namespace: str = NAMESPACE
) -> dict[str, Any]:
    """A listener pod; ports below 1024 (DNS, HTTPS) are bound without root or a capability
    through the namespaced sysctl Kubernetes counts as safe."""
    low = any(int(str(p).lstrip("u")) < 1024 for p in ports)
    sysctls = [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}] if low else []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            **({"securityContext": {"sysctls": sysctls}} if sysctls else {}),
            "containers": [
                {
                    "name": "listen",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", LISTEN, *map(str, ports)],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


PODS = {
    "np-control": ({LABEL_ROLLOUT: ROLLOUT, LABEL_ARM: "control"}, (SERVING_PORT, OTHER_PORT)),
    "np-candidate": ({LABEL_ROLLOUT: ROLLOUT, LABEL_ARM: "candidate"}, (SERVING_PORT,)),
    "np-production": ({"app": "vllm"}, (SERVING_PORT,)),
    # The eval Job's pod template labels (manifests.build_eval_job): rollout + arm "eval".
    "np-eval": ({LABEL_ROLLOUT: ROLLOUT, LABEL_ARM: "eval"}, (EVAL_PORT,)),
}


@pytest.fixture(scope="module")
def operator_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make images` (hack/build-images.sh): the operator image as an OCI archive."""
    out = tmp_path_factory.mktemp("images")
    proc = subprocess.run(
        [str(ROOT / "hack/build-images.sh")],
        # no load Job runs here: the load image (the largest) is the demo's
        env={**os.environ, "KVGATE_IMAGE_ARCHIVE_DIR": str(out), "KVGATE_IMAGES": "operator eval"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "kvgate.tar"


@pytest.fixture(scope="module")
def policed_node(
    operator_image: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster_mod.Cluster]:
    state = tmp_path_factory.mktemp("np-node")
    c = cluster_mod.Cluster(state, node_kind="containerd", network_policy=True)
    lacking = containerd_node.missing(Path(c.bin_dir))
    if lacking and os.environ.get("CI") != "true":
        pytest.skip("the real node needs: " + "; ".join(lacking))
    c.start(timeout=300)
    try:
        c.import_image(operator_image)
        yield c
    finally:
        c.stop()
        left = containerd_node.leftovers(state / "node")
        assert left == [], f"the node left these behind: {left}"


def reaches(
    c: cluster_mod.Cluster, source: str, ip: str, port: int | str, namespace: str = NAMESPACE
) -> bool:
    """Whether pod `source` opens a TCP connection to ip:port (or sends a UDP datagram to
    port "u<N>") and reads the listener's answer."""
    proc = c.kubectl(
        "exec", "-n", namespace, source, "--", "python", "-c", PROBE, ip, str(port),
        check=False, timeout=30,
    )  # fmt: skip
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def start_pods(c: cluster_mod.Cluster, pods: list[dict[str, Any]]) -> dict[str, str]:
    """Apply the pods, wait until each runs and its listener is bound; their IPs by name."""
    c.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                    "items": pods}))  # fmt: skip
    where = {p["metadata"]["name"]: p["metadata"]["namespace"] for p in pods}

    def running_ips() -> dict[str, str] | None:
        got = json.loads(c.kubectl("get", "pods", "-A", "-o", "json").stdout)
        ips = {
            p["metadata"]["name"]: p["status"].get("podIP", "")
            for p in got["items"]
            if where.get(p["metadata"]["name"]) == p["metadata"]["namespace"]
            and any(s.get("ready") for s in p["status"].get("containerStatuses", []))
        }
        return ips if len(ips) == len(where) and all(ips.values()) else None

    ips = wait_for(running_ips, 300, f"pods {sorted(where)} running", interval=1)
    # Each pod is on the node's bridge (the engine sees bridged traffic through iptables).
    assert all(ip.startswith("10.244.0.") for ip in ips.values()), ips
    # The listeners print once bound; a probe before that would be refused for the wrong reason.
    wait_for(
        lambda: all(
            "listening" in c.kubectl("logs", "-n", ns, name, check=False).stdout
            for name, ns in where.items()
        ),
        60,
        "the listeners bound",
    )
    return ips


def lift(c: cluster_mod.Cluster, policy: dict[str, Any], source: str, blocked_ip: str) -> None:
    """Delete `policy` and wait (bounded) until `source` reaches the serving port it blocked."""
    name = policy["metadata"]["name"]
    c.kubectl("delete", "networkpolicy", "-n", NAMESPACE, name)
    wait_for(
        lambda: reaches(c, source, blocked_ip, SERVING_PORT),
        90,
        f"the engine to lift {name}",
        interval=1,
    )


def reachability(c: cluster_mod.Cluster, ips: dict[str, str]) -> dict[str, bool]:
    return {
        "eval -> control:serving": reaches(c, "np-eval", ips["np-control"], SERVING_PORT),
        "eval -> candidate:serving": reaches(c, "np-eval", ips["np-candidate"], SERVING_PORT),
        "eval -> control:other": reaches(c, "np-eval", ips["np-control"], OTHER_PORT),
        "eval -> production:serving": reaches(c, "np-eval", ips["np-production"], SERVING_PORT),
        "control -> eval": reaches(c, "np-control", ips["np-eval"], EVAL_PORT),
    }


ALL_OPEN = dict.fromkeys(
    (
        "eval -> control:serving",
        "eval -> candidate:serving",
        "eval -> control:other",
        "eval -> production:serving",
        "control -> eval",
    ),
    True,
)
POLICED = {**ALL_OPEN, "eval -> control:other": False, "eval -> production:serving": False,
           "control -> eval": False}  # fmt: skip


@pytest.mark.timeout(1500)
def test_the_eval_jobs_policy_is_enforced_on_the_real_node(
    policed_node: cluster_mod.Cluster,
) -> None:
    c = policed_node
    # The engine reads the cluster as its own ServiceAccount, with read rights only.
    sa = "system:serviceaccount:{}:{}".format(*containerd_node.POLICY_ENGINE_SA)
    for verb, resource, allowed in (
        ("watch", "networkpolicies.networking.k8s.io", True),
        ("list", "pods", True),
        ("list", "secrets", False),
        ("create", "pods", False),
    ):
        can = c.kubectl("auth", "can-i", verb, resource, "-A", f"--as={sa}", check=False)
        assert (can.stdout.strip() == "yes") is allowed, (verb, resource, can.stdout)

    ips = start_pods(c, [pod(name, labels, ports) for name, (labels, ports) in PODS.items()])

    # WITHOUT a policy: everything reaches everything (so what follows can fail).
    assert reachability(c, ips) == ALL_OPEN

    # WITH the policy the operator builds for this rollout's eval Job.
    policy = manifests.build_eval_network_policy(
        rollout=ROLLOUT, namespace=NAMESPACE, canary_port=SERVING_PORT, hub=False
    )
    c.kubectl("apply", "-f", "-", input=json.dumps(policy))
    wait_for(
        lambda: not reaches(c, "np-eval", ips["np-production"], SERVING_PORT),
        90,
        "the engine to enforce the eval Job's policy",
        interval=1,
    )
    assert reachability(c, ips) == POLICED
    # The engine's ipsets are on the host now, and teardown must remove them (leftovers sees them).
    assert c.node is not None
    held = containerd_node.leftovers(c.node.state)
    assert any(x.startswith("ipset KUBE-") for x in held), held
    assert "iptables chain iptables/filter/KUBE-ROUTER-FORWARD" in held, held

    # The policy deleted: open again, so the policy (not the engine by itself) was the block.
    lift(c, policy, "np-eval", ips["np-production"])
    assert reachability(c, ips) == ALL_OPEN
    c.kubectl("delete", "pods", "-n", NAMESPACE, *PODS, "--wait=false")


CHART_NS = {"release": "np-kvgate", "allowed": "np-monitoring", "other": "np-elsewhere"}
HEALTH_PORT = 8080  # charts/kvgate/values.yaml: health.port
METRICS_PORT = 9090  # metrics.port
UNLISTED_PORT = 9999  # a port the operator's pod listens on that the policy does not name


@pytest.mark.timeout(900)
def test_the_charts_operator_policy_is_enforced_on_the_real_node(
    policed_node: cluster_mod.Cluster, tmp_path: Path
) -> None:
    """`networkPolicy.enabled=true`: the operator's health and metrics ports answer pods of the
    release namespace and of an allowed one, not those of another namespace; no other port of
    the operator's pod answers anyone. The policy is the one `helm template` renders."""
    c = policed_node
    helm = Helm(c, tmp_path / "helm")
    rendered = helm(
        "template", "kvgate", str(CHART), "--namespace", CHART_NS["release"],
        "--kube-version", cluster_mod.KUBE_VERSION,
        "--set", "networkPolicy.enabled=true",
        "--set", f"networkPolicy.allowedNamespaces={{{CHART_NS['allowed']}}}",
        "--show-only", "templates/networkpolicy.yaml",
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    (policy,) = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert policy["kind"] == "NetworkPolicy", policy
    ports = {p["port"] for p in policy["spec"]["ingress"][0]["ports"]}
    assert ports == {HEALTH_PORT, METRICS_PORT}, ports
    for ns in CHART_NS.values():
        c.kubectl("create", "namespace", ns)
    try:
        # Pods made before the namespace's default ServiceAccount exists are refused.
        wait_for(
            lambda: all(
                c.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0
                for ns in CHART_NS.values()
            ),
            60,
            "the namespaces' default ServiceAccounts",
        )
        # A stand-in for the operator's pod: the chart's selector labels, listening on the
        # health, metrics and one unlisted port; one client pod in each namespace.
        operator_labels = policy["spec"]["podSelector"]["matchLabels"]
        pods = [
            pod("operator", operator_labels, (HEALTH_PORT, METRICS_PORT, UNLISTED_PORT),
                CHART_NS["release"]),
            *(pod(f"client-{k}", {"role": "client"}, (EVAL_PORT,), ns)
              for k, ns in CHART_NS.items()),
        ]  # fmt: skip
        ips = start_pods(c, pods)
        operator_ip = ips["operator"]

        def table() -> dict[tuple[str, int], bool]:
            return {
                (k, port): reaches(c, f"client-{k}", operator_ip, port, ns)
                for k, ns in CHART_NS.items()
                for port in (HEALTH_PORT, METRICS_PORT, UNLISTED_PORT)
            }

        # WITHOUT the policy every client reaches every port.
        assert table() == dict.fromkeys(table_keys(), True)
        c.kubectl("apply", "-f", "-", input=json.dumps(policy))
        wait_for(
            lambda: not reaches(c, "client-other", operator_ip, METRICS_PORT, CHART_NS["other"]),
            90,
            "the engine to enforce the operator's policy",
            interval=1,
        )
        expected = {
            (k, port): k in ("release", "allowed") and port != UNLISTED_PORT
            for k, port in table_keys()
        }
        assert table() == expected
    finally:
        for ns in CHART_NS.values():
            c.delete_namespace(ns, wait=60)


def table_keys() -> list[tuple[str, int]]:
    return [(k, port) for k in CHART_NS for port in (HEALTH_PORT, METRICS_PORT, UNLISTED_PORT)]


LJ = "lj"  # a rollout of its own: the eval test's pods may still be terminating
LJ_PODS: dict[str, tuple[dict[str, str], tuple[int | str, ...]]] = {
    "lj-control": ({LABEL_ROLLOUT: LJ, LABEL_ARM: "control"}, (SERVING_PORT,)),
    "lj-candidate": ({LABEL_ROLLOUT: LJ, LABEL_ARM: "candidate"}, (SERVING_PORT,)),
    "lj-production": ({"app": "vllm-lj"}, (SERVING_PORT,)),
    # The load Job's pod template labels (manifests.build_load_job): rollout + arm "load".
    "lj-load": ({LABEL_ROLLOUT: LJ, LABEL_ARM: "load"}, (EVAL_PORT,)),
    "lj-eval": ({LABEL_ROLLOUT: LJ, LABEL_ARM: "eval"}, (EVAL_PORT,)),
    # Stand-ins for the cluster's resolver and the hub: the policies name ports, not addresses.
    "lj-resolver": ({"role": "resolver"}, (manifests.DNS_PORT, f"u{manifests.DNS_PORT}", "u5353")),
    "lj-hub": ({"role": "hub"}, (manifests.HUB_PORT,)),
}
LJ_PROBES: dict[str, tuple[str, str, int | str]] = {
    "load -> control:serving": ("lj-load", "lj-control", SERVING_PORT),
    "load -> candidate:serving": ("lj-load", "lj-candidate", SERVING_PORT),
    "load -> production:serving": ("lj-load", "lj-production", SERVING_PORT),
    "load -> resolver:53/udp": ("lj-load", "lj-resolver", f"u{manifests.DNS_PORT}"),
    "load -> resolver:53/tcp": ("lj-load", "lj-resolver", manifests.DNS_PORT),
    "load -> resolver:5353/udp": ("lj-load", "lj-resolver", "u5353"),  # UDP, not DNS's port
    "load -> hub:443": ("lj-load", "lj-hub", manifests.HUB_PORT),
    "eval -> hub:443": ("lj-eval", "lj-hub", manifests.HUB_PORT),
    "eval -> resolver:53/udp": ("lj-eval", "lj-resolver", f"u{manifests.DNS_PORT}"),
    "eval -> production:serving": ("lj-eval", "lj-production", SERVING_PORT),
    "control -> load": ("lj-control", "lj-load", EVAL_PORT),
}
LJ_POLICED = {
    **dict.fromkeys(LJ_PROBES, True),
    "load -> production:serving": False,
    "load -> resolver:5353/udp": False,  # the UDP probe can fail: only 53 is allowed
    "load -> hub:443": False,  # the load policy is built without the hub
    "eval -> production:serving": False,
    "control -> load": False,  # no ingress
}


@pytest.mark.timeout(900)
def test_the_load_jobs_policy_and_the_dns_and_hub_rules_on_the_real_node(
    policed_node: cluster_mod.Cluster,
) -> None:
    c = policed_node
    ips = start_pods(c, [pod(name, labels, ports) for name, (labels, ports) in LJ_PODS.items()])

    def table() -> dict[str, bool]:
        return {k: reaches(c, src, ips[dst], port) for k, (src, dst, port) in LJ_PROBES.items()}

    assert table() == dict.fromkeys(LJ_PROBES, True)  # without policies: all open
    load = manifests.build_eval_network_policy(
        rollout=LJ, namespace=NAMESPACE, canary_port=SERVING_PORT, hub=False, role="load"
    )
    evaluation = manifests.build_eval_network_policy(
        rollout=LJ, namespace=NAMESPACE, canary_port=SERVING_PORT, hub=True
    )
    assert load["metadata"]["name"] != evaluation["metadata"]["name"]
    for policy in (load, evaluation):
        c.kubectl("apply", "-f", "-", input=json.dumps(policy))
    wait_for(
        lambda: (
            not reaches(c, "lj-load", ips["lj-production"], SERVING_PORT)
            and not reaches(c, "lj-eval", ips["lj-production"], SERVING_PORT)
        ),
        90,
        "the engine to enforce the load and eval policies",
        interval=1,
    )
    assert table() == LJ_POLICED
    lift(c, load, "lj-load", ips["lj-production"])
    # the eval policy still holds: the two are separate objects with separate selectors
    assert not reaches(c, "lj-eval", ips["lj-production"], SERVING_PORT)
    assert reaches(c, "lj-load", ips["lj-hub"], manifests.HUB_PORT)
    c.kubectl("delete", "networkpolicy", "-n", NAMESPACE, evaluation["metadata"]["name"])
    c.kubectl("delete", "pods", "-n", NAMESPACE, *LJ_PODS, "--wait=false")
