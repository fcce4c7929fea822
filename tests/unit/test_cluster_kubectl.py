"""hack/cluster.py's kubectl runner lets kubectl's own `--timeout=` answer first: a test's
cleanup that waits with check=False gets kubectl's exit code, not a TimeoutExpired that skips
the rest of the cleanup (in CI one skipped an operator's stop, whose Lease then kept 13 later
tests' operators from ever starting)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import cluster  # noqa: E402


@pytest.mark.parametrize(
    ("args", "seconds"),
    [
        (("wait", "--for=delete", "kvr", "--all", "--timeout=60s"), 60.0),
        (("rollout", "status", "deployment/x", "--timeout=2m"), 120.0),
        (("delete", "kvr", "--all", "--timeout=1h"), 3600.0),
        (("delete", "kvr", "--all", "--timeout=90"), 90.0),
        (("get", "pods"), 0.0),
        (("delete", "pod", "x", "--timeout=1m30s"), 0.0),  # not a form the runner reads
    ],
)
def test_the_timeout_kubectl_was_given(args: tuple[str, ...], seconds: float) -> None:
    assert cluster._kubectl_timeout(args) == seconds


def test_kubectls_own_timeout_answers_before_the_process_is_killed(tmp_path: Path) -> None:
    # GIVEN a kubectl that takes 2 s to give up on its --timeout=1s
    fake = tmp_path / "kubectl"
    fake.write_text("#!/bin/sh\nsleep 2\necho 'timed out waiting' >&2\nexit 1\n")
    fake.chmod(0o755)
    runner = SimpleNamespace(bin_dir=str(tmp_path), kubeconfig="/dev/null")
    # WHEN a caller passes a process timeout shorter than that
    proc = cluster.Cluster.kubectl(
        runner,  # type: ignore[arg-type]
        "wait", "--for=delete", "kvr", "--all", "--timeout=1s",
        check=False, timeout=1.0,
    )  # fmt: skip
    # THEN kubectl's answer comes back
    assert proc.returncode == 1
    assert "timed out waiting" in proc.stderr


def test_a_kubectl_without_its_own_timeout_is_still_bounded(tmp_path: Path) -> None:
    fake = tmp_path / "kubectl"
    fake.write_text("#!/bin/sh\nexec sleep 5\n")
    fake.chmod(0o755)
    runner = SimpleNamespace(bin_dir=str(tmp_path), kubeconfig="/dev/null")
    with pytest.raises(subprocess.TimeoutExpired):
        cluster.Cluster.kubectl(runner, "get", "pods", timeout=0.5)  # type: ignore[arg-type]
