"""hack/containerd_node.py's pure parts: the sandbox image archive and the host checks."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import containerd_node  # noqa: E402


def test_the_sandbox_archive_is_a_valid_one_layer_oci_image(tmp_path: Path) -> None:
    program = tmp_path / "pause"
    program.write_bytes(b"\x7fELF fake program")
    program.chmod(0o755)
    archive = tmp_path / "pause.tar"
    containerd_node.write_oci_archive(archive, program, "localhost/kvgate-pause:1")

    with tarfile.open(archive) as tar:

        def read(name: str) -> bytes:
            member = tar.extractfile(name)
            assert member is not None
            return member.read()

        def blob(descriptor: dict[str, str]) -> bytes:
            data = read("blobs/sha256/" + descriptor["digest"].split(":", 1)[1])
            # Every blob is stored under its own digest, with its size.
            assert "sha256:" + hashlib.sha256(data).hexdigest() == descriptor["digest"]
            assert len(data) == int(descriptor["size"])
            return data

        assert json.loads(read("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        (top,) = json.loads(read("index.json"))["manifests"]
        assert top["annotations"]["org.opencontainers.image.ref.name"] == "localhost/kvgate-pause:1"
        manifest = json.loads(blob(top))
        config = json.loads(blob(manifest["config"]))
        (layer_descriptor,) = manifest["layers"]
        layer = gzip.decompress(blob(layer_descriptor))

    assert config["config"]["Entrypoint"] == ["/pause"]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(layer)) as files:
        (member,) = files.getmembers()
        assert member.name == "pause" and member.mode & 0o111
        extracted = files.extractfile(member)
        assert extracted is not None and extracted.read() == program.read_bytes()


def test_the_archive_is_reproducible(tmp_path: Path) -> None:
    program = tmp_path / "pause"
    program.write_bytes(b"same bytes")
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    containerd_node.write_oci_archive(a, program, "x:1")
    program.touch()  # a newer mtime must not change the image
    containerd_node.write_oci_archive(b, program, "x:1")
    with tarfile.open(a) as ta, tarfile.open(b) as tb:
        index_a, index_b = (t.extractfile("index.json") for t in (ta, tb))
        assert index_a is not None and index_b is not None
        assert index_a.read() == index_b.read()


def test_missing_names_each_binary_and_its_fix(tmp_path: Path) -> None:
    lacking = containerd_node.missing(tmp_path)
    for binary in containerd_node.NODE_BINARIES:
        assert f"{binary} (hack/build-binaries.sh --node)" in lacking


def test_teardown_of_a_directory_that_never_held_a_node_touches_nothing(tmp_path: Path) -> None:
    assert containerd_node.teardown(tmp_path / "absent", log=lambda _m: None) == []
    (tmp_path / "node").mkdir()
    # No bridge marker: a kvgate0 of another cluster, and KUBE-* chains, are not ours to remove.
    assert containerd_node.teardown(tmp_path / "node", log=lambda _m: None) == []


def test_a_state_dir_too_deep_for_the_kubelets_sockets_is_refused_in_one_line() -> None:
    # The CI path that made the kubelet exit with `bind: invalid argument` (108 bytes).
    deep = Path("/tmp/pytest-of-root/pytest-164/test_down_after_a_sigkilled_su0/cluster/node")
    with pytest.raises(containerd_node.NodeError) as refused:
        containerd_node.check_socket_room(deep)
    assert str(refused.value) == (
        f"the state directory {deep} is 75 bytes long; the kubelet's unix sockets under it "
        "need it to be at most 71 (use a shorter --state-dir)"
    )
    # At the limit it is accepted: 71 bytes + "/kubelet/device-plugins/kubelet.sock" = 107.
    edge = Path("/" + "s" * 70)
    containerd_node.check_socket_room(edge)
    assert len(str(edge / containerd_node.KUBELET_SOCKET_TAIL)) == 107


def test_the_policy_engines_ipsets_are_told_from_foreign_ones() -> None:
    """Teardown destroys exactly kube-router's sets: its policy sets and its swap sets."""
    ours = ("KUBE-SRC-AB3XYZ", "KUBE-DST-QWERTY23", "TMP-ABCDEFGHIJKLMNOP")
    foreign = ("TMP-short", "TMP-ABCDEFGHIJKLMNOPQ", "tmp-abcdefghijklmnop", "KUBE-OTHER", "cilium")
    assert [n for n in ours if containerd_node._ENGINE_IPSET.match(n)] == list(ours)
    assert [n for n in foreign if containerd_node._ENGINE_IPSET.match(n)] == []


def test_the_policy_engine_listens_on_nothing_and_reads_as_its_own_account(
    tmp_path: Path,
) -> None:
    node = containerd_node.ContainerdNode(tmp_path, tmp_path / "bin", "n1")
    kubeconfig = node.policy_engine_kubeconfig(
        "https://10.244.0.1:6443", tmp_path / "ca.crt", "tok-123"
    )
    assert kubeconfig.stat().st_mode & 0o777 == 0o600
    config = json.loads(kubeconfig.read_text())
    assert config["users"] == [{"name": "netpol", "user": {"token": "tok-123"}}]
    argv = node.policy_engine_argv(kubeconfig, "10.0.0.0/24")
    assert argv[0] == str(tmp_path / "bin" / "kube-router")
    # Only its firewall runs; no health, metrics or BGP listener is opened.
    for flag in ("--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
                 "--health-port=0", "--metrics-port=0", "--hostname-override=n1",
                 f"--kubeconfig={kubeconfig}", "--service-cluster-ip-range=10.0.0.0/24"):  # fmt: skip
        assert flag in argv
    rules = next(o for o in containerd_node.POLICY_ENGINE_RBAC if o["kind"] == "ClusterRole")
    verbs = {v for rule in rules["rules"] for v in rule["verbs"]}  # type: ignore[index,attr-defined]
    assert verbs == {"get", "list", "watch"}


def test_containerd_starts_our_shim_whatever_is_first_on_path(tmp_path: Path) -> None:
    """A host with Debian's containerd or docker.io has a 1.x containerd-shim-runc-v2 in
    /usr/bin; found on PATH, this containerd cannot start it ("io.containerd.runc.v2: type with
    url ...: not found") and no pod gets a sandbox (seen on this machine after docker.io was
    installed). The config names the shim built beside containerd."""
    import tomllib

    node = containerd_node.ContainerdNode(tmp_path, tmp_path / "bin", "n1")
    for sub in ("cni-conf", "cni-ipam", "kubelet", "runc", "netns", "opt"):
        (tmp_path / sub).mkdir()
    node._write_configs()
    config = tomllib.loads((tmp_path / "containerd.toml").read_text())
    runc = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["runtime_path"] == str(tmp_path / "bin" / "containerd-shim-runc-v2")
