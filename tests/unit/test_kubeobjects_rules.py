"""The Deployment, Job and rollout rules `controller/observe.py` applies, read from plain dicts."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.evidence import kubeobjects


def _deployment(replicas: int = 2, generation: int = 3, **status: int) -> dict[str, Any]:
    full = {
        "observedGeneration": generation,
        "updatedReplicas": replicas,
        "availableReplicas": replicas,
        "readyReplicas": replicas,
        "replicas": replicas,
    }
    return {"spec": {"replicas": replicas}, "status": {**full, **status}}


def test_rolled_out_needs_the_generation_and_every_replica() -> None:
    assert kubeobjects.rolled_out(_deployment(), 3)
    assert not kubeobjects.rolled_out(_deployment(), 4)  # controller has not seen it yet
    assert not kubeobjects.rolled_out(_deployment(), 0)  # no generation recorded: not done
    assert not kubeobjects.rolled_out(_deployment(updatedReplicas=1), 3)
    surging = _deployment()
    surging["status"]["replicas"] = 3  # an old pod not yet gone
    assert not kubeobjects.rolled_out(surging, 3)
    assert not kubeobjects.rolled_out(_deployment(unavailableReplicas=1), 3)
    assert not kubeobjects.rolled_out({"spec": {}, "status": {"observedGeneration": 3}}, 3)


def _job(*conditions: dict[str, str], succeeded: int = 0) -> dict[str, Any]:
    return {"status": {"conditions": list(conditions), "succeeded": succeeded}}


def test_job_finished_on_failure_success_or_completion() -> None:
    assert not kubeobjects.job_finished({})
    assert not kubeobjects.job_finished(_job({"type": "Failed", "status": "False"}))
    assert kubeobjects.job_finished(_job({"type": "Failed", "status": "True"}))
    assert kubeobjects.job_finished(_job({"type": "Complete", "status": "True"}))
    assert kubeobjects.job_finished(_job(succeeded=1))


def test_job_failure_names_the_failed_condition() -> None:
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    assert kubeobjects.job_failure(_job(failed)) == "BackoffLimitExceeded"
    worded = {**failed, "message": "Job has reached the specified backoff limit"}
    assert kubeobjects.job_failure(_job(worded)) == "Job has reached the specified backoff limit"
    assert kubeobjects.job_failure(_job()) == "the Job ended without a summary line"


def _rollout(name: str, created: str, phase: str | None, **status: str) -> dict[str, Any]:
    state = {"phase": phase, **status} if phase else {}
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"targetRef": {"name": "llm"}},
        "status": state,
    }


MINE = ("2026-01-01T00:00:10Z", "mine")


@pytest.mark.parametrize(
    ("other", "conflict"),
    [
        (_rollout("mine", "2026-01-01T00:00:00Z", "Canary"), False),  # itself
        (_rollout("a", "2026-01-01T00:00:20Z", "Canary"), True),  # past Pending: claimed
        (_rollout("a", "2026-01-01T00:00:00Z", None), True),  # older Pending wins
        (_rollout("a", "2026-01-01T00:00:20Z", "Pending"), False),  # newer Pending loses
        (_rollout("a", "2026-01-01T00:00:10Z", None), True),  # same time: name decides
        (_rollout("z", "2026-01-01T00:00:10Z", None), False),
        (_rollout("a", "2026-01-01T00:00:00Z", "RolledBack"), False),  # terminal
        (
            _rollout("a", "2026-01-01T00:00:00Z", "AwaitingApproval", reason="VerdictReported"),
            False,
        ),
        (_rollout("a", "2026-01-01T00:00:00Z", "AwaitingApproval", reason="Passed"), True),
    ],
)
def test_rollout_conflict(other: dict[str, Any], conflict: bool) -> None:
    expected = other["metadata"]["name"] if conflict else None
    assert kubeobjects.rollout_conflict(other, MINE, "llm") == expected


def test_rollout_conflict_ignores_other_deployments() -> None:
    other = _rollout("a", "2026-01-01T00:00:00Z", "Canary")
    assert kubeobjects.rollout_conflict(other, MINE, "other-llm") is None
