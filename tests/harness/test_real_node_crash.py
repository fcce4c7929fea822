"""A real node whose supervisor is SIGKILLed leaves nothing behind after `cluster.py down`.

`cluster.py up --node containerd` starts a detached supervisor; a pod runs (the node's own
sandbox image, so no image build is needed), which gives the host shims, overlay mounts, a
network namespace, a veth, KUBE-* chains and kubepods cgroups. Then the supervisor and every
component are SIGKILLed, as a crash or an OOM kill would, and `cluster.py down` must clean up
from the state directory alone: `containerd_node.leftovers()` is empty afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
# The e2e scenario helpers (tests/e2e/support.py) serve the harness tests too.
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from support import wait_for  # noqa: E402

import cluster as cluster_mod  # noqa: E402
import containerd_node  # noqa: E402

pytestmark = [pytest.mark.harness]

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "sleeper", "namespace": "default"},
    "spec": {
        "containers": [
            {
                "name": "pause",
                "image": containerd_node.SANDBOX_IMAGE,
                "imagePullPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65535},
            }
        ]
    },
}


def cli(state: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "hack/cluster.py"), *args, f"--state-dir={state}"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(900)
def test_down_after_a_sigkilled_supervisor_leaves_nothing() -> None:
    # pytest's tmp_path can be too deep for the kubelet's unix sockets (107 bytes at most):
    # the node refuses such a state dir (containerd_node.check_socket_room), so a short one.
    state = Path(tempfile.mkdtemp(prefix="kvgate-crash-", dir="/tmp")) / "cluster"
    lacking = containerd_node.missing(Path(cluster_mod.default_bin_dir()))
    if lacking and os.environ.get("CI") != "true":
        pytest.skip("the real node needs: " + "; ".join(lacking))
    up = cli(state, "up", "--node", "containerd")
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        c = cluster_mod.Cluster(state, node_kind="containerd")
        c.server = json.loads((state / "cluster.json").read_text())["server"]
        c.kubectl("apply", "-f", "-", input=json.dumps(POD))
        wait_for(
            lambda: (
                c.kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}").stdout
                == "Running"
            ),
            180,
            "the pod to run",
            interval=1,
        )
        held = containerd_node.leftovers(state / "node")
        # The node really holds host resources that a crash would strand.
        assert any(x.startswith("mount ") for x in held), held
        assert any(x.startswith("process ") for x in held), held
        assert any(x.startswith("iptables chain ") for x in held), held

        # The crash: the supervisor and every component, SIGKILL, no chance to clean up.
        pids = json.loads((state / "cluster.json").read_text())["pids"]
        supervisor = int((state / "pids" / "supervisor.pid").read_text())
        for pid in [supervisor, *pids.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stranded = containerd_node.leftovers(state / "node")
        assert any(x.startswith("mount ") for x in stranded), stranded
    finally:
        down = cli(state, "down", timeout=120)
    assert down.returncode == 0, down.stderr[-3000:]
    left = containerd_node.leftovers(state / "node")
    assert left == [], f"after a crash and `down`, still on the host: {left}"
    shutil.rmtree(state.parent, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_node_refuses_to_start_beside_foreign_kube_chains(tmp_path: Path) -> None:
    """Teardown deletes every KUBE-* chain, so a start beside another kubelet's or
    kube-proxy's chains must refuse, and touch nothing: no bridge, no sysctl, no files."""
    bin_dir = Path(cluster_mod.default_bin_dir())
    lacking = containerd_node.missing(bin_dir)
    if lacking and os.environ.get("CI") != "true":
        pytest.skip("the real node needs: " + "; ".join(lacking))
    chain = "KUBE-KVGATE-FOREIGN-TEST"
    subprocess.run(["iptables", "-t", "filter", "-N", chain], check=True)
    try:
        node = containerd_node.ContainerdNode(tmp_path / "node", bin_dir, "n")
        with pytest.raises(containerd_node.NodeError, match=chain):
            node.prepare()
        assert not Path(f"/sys/class/net/{containerd_node.BRIDGE}").exists()
        assert not (tmp_path / "node").exists()
    finally:
        subprocess.run(["iptables", "-t", "filter", "-X", chain], check=False)
