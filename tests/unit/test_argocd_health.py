"""The Argo CD health check (charts/kvgate/argocd/health.lua), run as real Lua via lupa.

Argo CD runs health scripts in gopher-lua (Lua 5.1), so every case runs under Lua 5.1 and,
to catch version-specific code, under Lua 5.4 too.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "charts/kvgate/argocd/health.lua"
PHASES = [
    "Pending",
    "Preflight",
    "Canary",
    "Evaluating",
    "Measuring",
    "AwaitingApproval",
    "Promoting",
    "Verifying",
    "Reverting",
    "PullRequestOpen",
    "PullRequestMerged",
    "Promoted",
    "RolledBack",
    "NotNeeded",
    "Failed",
    "Declined",
]


def _lupa(version: str) -> Any:
    # lupa (PyPI) embeds Lua; it belongs in the `dev` extra. Until it is there, skip rather
    # than fail, so a CI environment built from pyproject.toml alone still passes.
    try:
        return importlib.import_module(f"lupa.{version}")
    except ImportError:
        pytest.skip("lupa is not installed (pip install lupa) to run the Lua health check")


@pytest.fixture(params=["lua51", "lua54"])
def health(request: pytest.FixtureRequest) -> Any:
    lupa = _lupa(request.param)
    script = SCRIPT.read_text()

    def run(obj: dict[str, Any]) -> tuple[str, str]:
        lua = lupa.LuaRuntime(unpack_returned_tuples=True)
        lua.globals().obj = lua.table_from(obj, recursive=True)
        # Argo CD wraps the script as a chunk and reads the returned table.
        hs = lua.execute(script)
        return hs["status"], hs["message"]

    return run


def rollout(phase: str | None, mode: str = "auto", **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "KVCacheRollout",
        "metadata": {"name": "r", "namespace": "ns", "generation": 1},
        "spec": {"targetRef": {"name": "vllm"}, "promotion": {"mode": mode}},
    }
    if phase is not None:
        obj["status"] = {"phase": phase, "observedGeneration": 1, **status}
    return obj


EXPECTED = {
    "Promoted": "Healthy",
    "NotNeeded": "Healthy",
    "RolledBack": "Degraded",
    "Failed": "Degraded",
    "AwaitingApproval": "Suspended",
    "PullRequestOpen": "Suspended",  # pullRequest mode: a person merges (or closes) the PR
    "Declined": "Degraded",  # the PR was closed unmerged: nothing was promoted
}


@pytest.mark.parametrize("phase", PHASES)
def test_each_phase_maps_to_a_health_status(health: Any, phase: str) -> None:
    status, message = health(rollout(phase, message=f"now {phase}"))
    assert status == EXPECTED.get(phase, "Progressing")
    assert message == f"{phase}: now {phase}"


@pytest.mark.parametrize("phase", ["AwaitingApproval", "RolledBack", "NotNeeded", "Promoted"])
def test_report_mode_verdicts_are_healthy(health: Any, phase: str) -> None:
    status, message = health(rollout(phase, mode="report", message="gate says no"))
    assert (status, message) == ("Healthy", "Report: gate says no")


def test_report_mode_failure_is_still_degraded(health: Any) -> None:
    assert health(rollout("Failed", mode="report"))[0] == "Degraded"


def test_report_mode_in_progress_is_progressing(health: Any) -> None:
    assert health(rollout("Evaluating", mode="report"))[0] == "Progressing"


def test_no_status_yet_is_progressing(health: Any) -> None:
    assert health(rollout(None)) == (
        "Progressing",
        "Waiting for the kvgate operator to pick up the rollout",
    )


def test_a_newer_spec_than_the_status_is_progressing(health: Any) -> None:
    obj = rollout("Promoted")
    obj["metadata"]["generation"] = 2
    assert health(obj) == ("Progressing", "Waiting for the operator to observe generation 2")


def test_stalled_condition_is_degraded_whatever_the_phase(health: Any) -> None:
    obj = rollout(
        "Pending",
        conditions=[
            {"type": "Ready", "status": "False", "reason": "InvalidSpec"},
            {
                "type": "Stalled",
                "status": "True",
                "reason": "InvalidSpec",
                "message": "spec.gates.accuracy.margin: too wide",
            },
        ],
    )
    assert health(obj) == ("Degraded", "InvalidSpec: spec.gates.accuracy.margin: too wide")


def test_stalled_false_does_not_degrade(health: Any) -> None:
    obj = rollout("Canary", conditions=[{"type": "Stalled", "status": "False", "reason": "Ok"}])
    assert health(obj) == ("Progressing", "Canary")


def test_missing_mode_defaults_to_auto(health: Any) -> None:
    obj = rollout("RolledBack")
    del obj["spec"]["promotion"]
    assert health(obj)[0] == "Degraded"


def test_phases_match_the_crd() -> None:
    import yaml

    crd = yaml.safe_load((SCRIPT.parents[1] / "crds/kvgate.io_kvcacherollouts.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["status"]["properties"]["phase"]["enum"] == PHASES


def test_reverting_progresses_and_a_failed_revert_degrades(health: Any) -> None:
    assert health(rollout("Reverting"))[0] == "Progressing"
    stuck = rollout(
        "Reverting",
        conditions=[{"type": "Stalled", "status": "True", "reason": "RevertFailed",
                     "message": "403 Forbidden"}],
    )  # fmt: skip
    assert health(stuck) == ("Degraded", "RevertFailed: 403 Forbidden")


def test_drift_after_promotion_degrades(health: Any) -> None:
    obj = rollout(
        "Promoted",
        conditions=[{"type": "Drifted", "status": "True", "reason": "Drifted", "message": "gone"}],
    )
    assert health(obj) == ("Degraded", "Drifted: gone")


@pytest.mark.parametrize(
    ("phase", "reason", "expected"),
    [
        ("AwaitingApproval", "VerdictReported", "Healthy"),
        ("RolledBack", "AccuracyRegressed", "Degraded"),
        ("NotNeeded", "PoolHasRoom", "Degraded"),  # fails closed: nothing was shown safe
        ("Failed", "EvalError", "Degraded"),
        ("Evaluating", "EvalStarted", "Progressing"),
        ("Canary", "CanaryStarting", "Progressing"),
        ("AwaitingApproval", "AwaitingApproval", "Progressing"),  # never a verdict in gate mode
    ],
)
def test_gate_mode_opens_only_on_a_passing_verdict(
    health: Any, phase: str, reason: str, expected: str
) -> None:
    status, message = health(rollout(phase, mode="gate", reason=reason, message="m"))
    assert status == expected
    if expected == "Healthy":
        assert message == "Gate open: m"
    if expected == "Degraded":
        assert message == "Gate closed: m"


def test_a_stale_gate_holds_the_next_sync(health: Any) -> None:
    stale = [{"type": "Stale", "status": "True", "reason": "Stale", "message": "image a -> b"}]
    obj = rollout("AwaitingApproval", mode="gate", reason="VerdictReported", conditions=stale)
    assert health(obj) == ("Progressing", "Verdict stale: image a -> b")
    fresh = [{"type": "Stale", "status": "False", "reason": "VerdictCurrent"}]
    obj = rollout("AwaitingApproval", mode="gate", reason="VerdictReported", conditions=fresh)
    assert health(obj)[0] == "Healthy"
