"""`kvgate get`, `wait`, `approve`, `abort`: the kubectl-side commands, over a scripted API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kvgate.adapters import kube_cli
from kvgate.cli import main


def rollout(phase: str | None, reason: str = "", **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"reason": reason, **status}
    if phase is not None:
        body["phase"] = phase
    return {
        "kind": "KVCacheRollout",
        "metadata": {"name": "vllm-fp8", "namespace": "llm", "generation": 2},
        "status": body,
    }


class Api:
    """What the commands read (one rollout per read, in order) and what they annotate."""

    def __init__(self, *reads: dict[str, Any]) -> None:
        self.reads = list(reads)
        self.annotated: list[tuple[str, str | None, dict[str, str]]] = []

    def get_rollout(self, namespace: str, name: str) -> dict[str, Any]:
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]

    def annotate_rollout(self, namespace: str, name: str, annotations: Any) -> None:
        self.annotated.append((name, namespace, dict(annotations)))

    def rollout_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return []


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def install(*reads: dict[str, Any]) -> Api:
        fake = Api(*reads)
        monkeypatch.setattr(kube_cli, "for_cli", lambda ns: (fake, ns or "default"))
        monkeypatch.setattr("time.sleep", lambda s: None)
        return fake

    yield install


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("phase", "reason", "code"),
    [
        ("Promoted", "Promoted", 0),
        ("NotNeeded", "PoolHasRoom", 0),
        ("AwaitingApproval", "VerdictReported", 0),
        ("RolledBack", "AccuracyRegressed", 1),
        ("Failed", "InvalidSpec", 1),
        ("Declined", "Declined", 1),  # pullRequest mode: the pull request was closed unmerged
        ("Failed", "NotApplied", 1),  # merged, never applied by the GitOps tool
    ],
)
def test_wait_exits_with_the_end(
    api: Any, capsys: pytest.CaptureFixture[str], phase: str, reason: str, code: int
) -> None:
    api(rollout("Evaluating", "EvalRunning"), rollout(phase, reason, message="done"))
    got, out, _ = run(capsys, "wait", "vllm-fp8", "-n", "llm", "--interval", "1s")
    assert got == code
    assert out.strip() == f"kvr/vllm-fp8 in llm: {phase} ({reason}): done"


def test_wait_reads_a_closed_gate_as_a_no(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # gate mode: NotNeeded closes the gate (Stalled=True), so a pipeline waiting on it stops
    stalled = [{"type": "Stalled", "status": "True", "reason": "PoolHasRoom"}]
    api(rollout("NotNeeded", "PoolHasRoom", message="gate closed: room", conditions=stalled))
    got, _, _ = run(capsys, "wait", "vllm-fp8", "-n", "llm", "--interval", "1s")
    assert got == 1


def test_wait_gives_up_at_its_timeout_with_3(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    api(rollout("AwaitingApproval", "AwaitingApproval", configHash="abc"))
    got, out, _ = run(capsys, "wait", "vllm-fp8", "--timeout", "1s", "--interval", "2s")
    assert got == 3 and "still running after 1s" in out


@pytest.mark.parametrize("flag", ["--timeout", "--interval"])
def test_wait_refuses_a_bad_duration_in_one_line(
    api: Any, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    api(rollout("Promoted"))
    got, out, err = run(capsys, "wait", "vllm-fp8", flag, "soon")
    assert (got, out) == (2, "") and len(err.splitlines()) == 1 and flag in err


def test_approve_annotates_the_tested_config_hash(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = api(rollout("AwaitingApproval", "AwaitingApproval", configHash="18cab288d5712cfa"))
    got, out, _ = run(capsys, "approve", "vllm-fp8", "-n", "llm")
    assert got == 0
    assert fake.annotated == [("vllm-fp8", "llm", {"kvgate.io/approve": "18cab288d5712cfa"})]
    assert "approved config 18cab288d5712cfa of kvr/vllm-fp8 in llm" in out


@pytest.mark.parametrize(
    "status",
    [
        rollout("Evaluating", "EvalRunning", configHash="abc"),
        rollout("AwaitingApproval", "VerdictReported", configHash="abc"),  # report mode's end
        rollout("AwaitingApproval", "AwaitingApproval"),  # no tested hash to name
        rollout(None),
    ],
)
def test_approve_refuses_what_is_not_awaiting_approval(
    api: Any, capsys: pytest.CaptureFixture[str], status: dict[str, Any]
) -> None:
    fake = api(status)
    got, _, err = run(capsys, "approve", "vllm-fp8")
    assert got == 2 and fake.annotated == []
    assert "not awaiting approval" in err and len(err.splitlines()) == 1


def test_abort_annotates_one_line_and_refuses_an_ended_rollout(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = api(rollout("Verifying", "Verifying"))
    got, out, _ = run(capsys, "abort", "vllm-fp8", "-n", "llm", "--reason", "freeze  for\tlaunch")
    assert got == 0 and fake.annotated == [
        ("vllm-fp8", "llm", {"kvgate.io/abort": "freeze for launch"})
    ]
    assert "abort requested for kvr/vllm-fp8 in llm" in out
    fake = api(rollout("Promoted", "Promoted"))
    got, _, err = run(capsys, "abort", "vllm-fp8", "--reason", "late")
    assert got == 2 and fake.annotated == [] and "has ended (Promoted)" in err


@pytest.mark.parametrize("reason", ["", "x" * 201, "bell\x07"])
def test_abort_needs_one_printable_line(
    api: Any, capsys: pytest.CaptureFixture[str], reason: str
) -> None:
    fake = api(rollout("Canary"))
    got, _, err = run(capsys, "abort", "vllm-fp8", "--reason", reason)
    assert got == 2 and fake.annotated == [] and "--reason" in err


def test_get_shows_gates_progress_and_how_to_approve(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    api(
        rollout(
            "AwaitingApproval",
            "AwaitingApproval",
            message="all gates passed",
            configHash="abc123",
            gates={
                "accuracy": {"outcome": "Successful", "reason": "NonInferior", "message": "ok"},
                "scales": {"outcome": "Warning", "reason": "ScalesMissing"},
            },
        )
    )
    got, out, _ = run(capsys, "get", "vllm-fp8", "-n", "llm")
    assert got == 0
    lines = out.splitlines()
    assert lines[0] == "kvr/vllm-fp8 in llm: AwaitingApproval (AwaitingApproval): all gates passed"
    assert any(line.split()[:3] == ["gate", "accuracy", "Successful"] for line in lines)
    assert any(line.split()[:3] == ["gate", "scales", "Warning"] for line in lines)
    assert "kvgate approve vllm-fp8 -n llm  (annotates kvgate.io/approve=abc123)" in out


def test_get_says_when_the_approval_expires(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    api(rollout("AwaitingApproval", "AwaitingApproval", message="all gates passed",
                configHash="abc123", approvalExpiresAt="2026-12-04T10:48:00Z"))  # fmt: skip
    got, out, _ = run(capsys, "get", "vllm-fp8", "-n", "llm")
    assert got == 0
    assert (
        "kvgate approve vllm-fp8 -n llm  (annotates kvgate.io/approve=abc123; expires "
        "2026-12-04 10:48 UTC)"
    ) in out


def test_get_shows_the_pull_request(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pr = {"number": 7, "url": "https://forge/acme/deploy/pulls/7", "state": "merged",
          "mergeSha": "f" * 40, "repository": "acme/deploy"}  # fmt: skip
    api(rollout("PullRequestMerged", "WaitingForGitOps", message="waiting", pullRequest=pr))
    _, out, _ = run(capsys, "get", "vllm-fp8", "-n", "llm")
    assert "  pull request #7 merged as ffffffffffff: https://forge/acme/deploy/pulls/7" in out


def test_get_watch_prints_each_change_once_and_exits_with_the_end(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    running = rollout(
        "Evaluating",
        "EvalRunning",
        eval={"progress": {"look": 2, "looks_planned": 4, "questions": 100, "difference": -0.01}},
    )
    api(running, running, rollout("RolledBack", "AccuracyRegressed", message="worse"))
    got, out, _ = run(capsys, "get", "vllm-fp8", "--watch", "--interval", "1s")
    assert got == 1
    assert out.count("Evaluating") == 1
    assert "eval look 2/4: 100 questions, candidate - control -1.0 pp" in out
    assert out.rstrip().endswith("RolledBack (AccuracyRegressed): worse")


def test_get_json_is_the_typed_status(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    api(rollout("Promoted", "Promoted", kv_tokens="junk", configHash="abc"))
    got, out, _ = run(capsys, "get", "vllm-fp8", "--json")
    data = json.loads(out)
    assert got == 0 and data["status"]["phase"] == "Promoted"
    assert data["status"]["configHash"] == "abc"


def test_get_watch_says_it_stopped_at_its_timeout(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """first-hour-2 N23: it ended with exit 3 and nothing saying it stopped."""
    api(rollout("Evaluating", "EvalRunning", message="eval attempt 1 running"))
    code, out, err = run(capsys, "get", "vllm-fp8", "-n", "llm", "--watch", "--timeout", "0s",
                         "--interval", "1s")  # fmt: skip
    assert code == 3 and "Evaluating" in out
    assert err.strip() == "stopped watching after 0s; still Evaluating"


def test_long_messages_are_cut_at_a_word_with_an_ellipsis(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """first-hour-2 N9/N23: "...4 I (still running after 3s)" and "... (margin " with no mark."""
    scheduler = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. " * 8
    api(
        rollout("Canary", "WaitingForCanary", message=f"control and candidate waiting: {scheduler}")
    )
    code, out, _ = run(capsys, "wait", "vllm-fp8", "-n", "llm", "--timeout", "0s")
    assert code == 3
    line = out.strip()
    assert line.endswith("… (still running after 0s)")
    cut = line.removesuffix("… (still running after 0s)")
    assert cut.split()[-1] in scheduler.split()  # a whole word before the mark


@pytest.mark.parametrize("command", ["get", "wait", "approve", "abort", "report"])
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["../../etc"], "argument name"),  # a path, not a name: never put in an API URL
        (["vllm-fp8\n"], "argument name"),  # a trailing newline, which `$` would let by
        (["Vllm-FP8"], "argument name"),
        (["a" * 254], "argument name"),
        (["vllm-fp8", "-n", "Team_A"], "argument -n/--namespace"),
        (["vllm-fp8", "-n", "a" * 64], "argument -n/--namespace"),
    ],
)
def test_a_name_that_is_not_kubernetes_is_refused_before_any_api_call(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    argv: list[str],
    named: str,
) -> None:
    def no_cluster(namespace: object) -> None:
        raise AssertionError("the API was reached with a bad name")

    monkeypatch.setattr(kube_cli, "for_cli", no_cluster)
    got, out, err = run(capsys, command, *argv)
    assert (got, out) == (2, "") and len(err.splitlines()) == 1, err
    assert f"kvgate {command}: error: {named}: " in err and "is not a Kubernetes name" in err


def test_the_longest_valid_names_pass(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    api(rollout("Promoted", "Promoted"))
    name = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    got, _, err = run(capsys, "wait", name, "-n", "n" * 63)
    assert got == 0, err
