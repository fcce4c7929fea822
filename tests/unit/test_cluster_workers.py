"""One local cluster per pytest-xdist worker (hack/cluster.py, hack/kubelet.py): each worker's
kubelet hands out pod IPs from its own slice of 127.16-254.x.y, so the e2e tier's two workers
never give two pods one IP (and so one IP:port)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import cluster  # noqa: E402
import kubelet  # noqa: E402


def prefixes_arg(worker: str, count: int) -> list[str]:
    return cluster.xdist_kubelet_args(
        {"PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": str(count)}
    )


def prefixes(worker: str, count: int) -> range:
    (arg,) = prefixes_arg(worker, count)
    name, _, value = arg.partition("=")
    assert name == "--ip-prefixes"
    lo, hi = kubelet.ip_prefix_range(value)
    return range(lo, hi + 1)


def test_without_xdist_the_kubelet_keeps_its_whole_range() -> None:
    assert cluster.xdist_kubelet_args({}) == []
    assert cluster.xdist_kubelet_args({"PYTEST_XDIST_WORKER": "master"}) == []
    required = ["--kubeconfig=k", "--port=1", "--tls-cert=c", "--tls-key=k", "--root-dir=d"]
    assert kubelet.build_parser().parse_args(required).ip_prefixes == cluster.POD_IP_PREFIXES
    args = kubelet.build_parser().parse_args([*required, *prefixes_arg("gw1", 2)])
    assert args.ip_prefixes == (135, 253)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8, 239])
def test_each_worker_gets_a_disjoint_non_empty_slice_of_the_range(count: int) -> None:
    slices = [prefixes(f"gw{i}", count) for i in range(count)]
    seen: set[int] = set()
    for s in slices:
        assert len(s) >= 1
        assert s.start >= 16 and s.stop - 1 <= 254
        assert seen.isdisjoint(s), (count, s)
        seen.update(s)


def test_two_workers_split_the_range_in_halves() -> None:
    assert prefixes("gw0", 2) == range(16, 135)
    assert prefixes("gw1", 2) == range(135, 254)


def test_more_workers_than_prefixes_is_one_clear_error() -> None:
    with pytest.raises(cluster.ClusterError, match="gw239 of 240: at most 239 clusters"):
        cluster.xdist_kubelet_args(
            {"PYTEST_XDIST_WORKER": "gw239", "PYTEST_XDIST_WORKER_COUNT": "240"}
        )


@pytest.mark.parametrize("bad", ["", "16", "0-10", "10-5", "16-255", "a-b", "-5"])
def test_a_bad_prefix_range_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected LO-HI within 1-254"):
        kubelet.ip_prefix_range(bad)


def test_a_cluster_beside_the_workers_takes_a_prefix_below_their_range() -> None:
    # the harness tier's test kubelet, run beside the e2e workers (hack/test_tiers.py BESIDE_ENV)
    (arg,) = cluster.xdist_kubelet_args({"KVGATE_POD_IP_PREFIX": "15"})
    assert arg == "--ip-prefixes=15-15"
    lo, hi = kubelet.ip_prefix_range(arg.partition("=")[2])
    workers = [prefixes(f"gw{i}", n) for n in (1, 2, 3) for i in range(n)]
    assert all(lo not in s and hi not in s for s in workers)
    # it wins over an xdist worker's slice (a beside tier run under xdist keeps its prefix)
    both = {"KVGATE_POD_IP_PREFIX": "15", "PYTEST_XDIST_WORKER": "gw0",
            "PYTEST_XDIST_WORKER_COUNT": "2"}  # fmt: skip
    assert cluster.xdist_kubelet_args(both) == ["--ip-prefixes=15-15"]


@pytest.mark.parametrize("bad", ["16", "200", "0", "x", "15-15"])
def test_a_beside_prefix_in_the_workers_range_or_malformed_is_refused(bad: str) -> None:
    with pytest.raises(cluster.ClusterError, match="KVGATE_POD_IP_PREFIX"):
        cluster.xdist_kubelet_args({"KVGATE_POD_IP_PREFIX": bad})
