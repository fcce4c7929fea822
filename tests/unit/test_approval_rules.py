"""Approval bound to an identity and a run, approval expiry, and abort (docs/security.md, 7).

The apiserver records who approved (the chart's admission policies, tested in
tests/e2e/test_approval.py); here the operator's second wall: what `read_approval` counts, and
what `next_step` does with an abort or an approval that never came.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest
from test_controller import World

from kvgate.config import OperatorConfig
from kvgate.errors import SpecError
from kvgate.flow import machine, steps
from kvgate.flow.steps import Action, LiveTarget, Observation, State
from kvgate.judge.approval import ApprovalRecord, abort_text, read_approval
from kvgate.records.status import GateResult
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Outcome, Phase

MANUAL = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "promotion": {"mode": "manual"}})
PASSED = {"accuracy": GateResult("accuracy", Outcome.SUCCESSFUL, "AccuracyNonInferior", "ok")}
GOOD = ApprovalRecord(
    approve="h1", created_by="alice", approved_by="carol", approved_generation="3"
)


def test_an_approval_by_another_identity_for_this_generation_counts() -> None:
    assert read_approval(GOOD, 3, require_identity=True) == ("h1", "carol", "")


@pytest.mark.parametrize(
    ("record", "generation", "require", "why"),
    [
        (replace(GOOD, approved_by="alice"), 3, False, "alice created this rollout"),
        (replace(GOOD, approved_generation="2"), 3, False, "given for generation 2"),
        (replace(GOOD, approved_by=None), 3, True, "carries no approver"),
        (replace(GOOD, created_by=None), 3, True, "carries no approver or author"),
        (replace(GOOD, approved_generation=None), 3, True, "carries no approver"),
    ],
)
def test_an_approval_that_does_not_count_says_why(
    record: ApprovalRecord, generation: int, require: bool, why: str
) -> None:
    approval, _, ignored = read_approval(record, generation, require_identity=require)
    assert approval is None and why in ignored


def test_without_the_policy_a_bare_approval_counts_and_none_is_none() -> None:
    bare = ApprovalRecord(approve="h1")
    assert read_approval(bare, 1, require_identity=False) == ("h1", "", "")
    assert read_approval(ApprovalRecord(), 1, require_identity=True) == (None, "", "")


def awaiting(**state: Any) -> steps.Step:
    return machine.next_step(
        MANUAL,
        State(phase=Phase.AWAITING_APPROVAL, config_hash="h1", gates=PASSED, **state),
        Observation(live=LiveTarget(exists=True, as_evaluated=True)),
        poll_s=2.0,
        approval_ttl_s=3600.0,
    )


def test_an_ignored_approval_holds_and_names_the_reason() -> None:
    s = awaiting(approval=None, approval_ignored="approval by alice ignored: alice created it")
    assert s.phase is Phase.AWAITING_APPROVAL
    assert s.message.endswith("; approval by alice ignored: alice created it")


def test_the_approver_is_named_in_the_event() -> None:
    s = awaiting(approval="h1", approver="carol", phase_elapsed_s=10)
    assert s.phase is Phase.PROMOTING
    assert [(e.reason, e.message) for e in s.events] == [
        ("Approved", "approved by carol for config h1")
    ]


def test_an_approval_past_the_ttl_never_promotes() -> None:
    s = awaiting(approval="h1", approver="carol", phase_elapsed_s=3600)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "ApprovalExpired")
    assert Action.PATCH_DEPLOYMENT not in s.actions and "stale" in s.message
    assert awaiting(approval=None, phase_elapsed_s=3599).phase is Phase.AWAITING_APPROVAL


def test_abort_text_is_one_bounded_line() -> None:
    text = abort_text(ApprovalRecord(abort="wrong\nmodel " + "x" * 500, aborted_by="dave"))
    assert text is not None and text.startswith("aborted by dave (kvgate.io/abort: wrong model x")
    assert "\n" not in text and len(text) < 260
    assert abort_text(ApprovalRecord(abort="")) is None


CARRIES = LiveTarget(exists=True, carries_candidate=True, ours_present=True)
CLEAN = LiveTarget(exists=True, as_evaluated=True, ours_present=False)


@pytest.mark.parametrize(
    "phase",
    [Phase.PENDING, Phase.PREFLIGHT, Phase.CANARY, Phase.EVALUATING, Phase.AWAITING_APPROVAL],
)
def test_abort_before_the_patch_ends_and_deletes_the_children(phase: Phase) -> None:
    live = None if phase is Phase.PENDING else CLEAN
    s = machine.next_step(MANUAL, State(phase=phase, abort="aborted by dave (x)"), Observation(live=live),
                    poll_s=2.0)  # fmt: skip
    assert (s.phase, s.reason, s.message) == (Phase.ROLLED_BACK, "Aborted", "aborted by dave (x)")
    assert {Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB} <= set(s.actions)
    assert Action.PATCH_DEPLOYMENT not in s.actions


@pytest.mark.parametrize("phase", [Phase.PROMOTING, Phase.VERIFYING])
def test_abort_after_the_patch_reverts_write_ahead(phase: Phase) -> None:
    s = machine.next_step(MANUAL, State(phase=phase, patched=True, abort="aborted by dave (x)"),
                    Observation(live=CARRIES), poll_s=2.0)  # fmt: skip
    assert s.phase is Phase.REVERTING and s.revert is not None
    assert (s.revert.phase, s.revert.reason) == (Phase.ROLLED_BACK, "Aborted")
    assert Action.REVERT_DEPLOYMENT not in s.actions  # the patch comes after the intent is stored
    # Reverting goes on reverting (an abort does not cut the read back short)
    r = machine.next_step(MANUAL, State(phase=Phase.REVERTING, revert=s.revert, abort="x"),
                    Observation(live=CARRIES), poll_s=2.0)  # fmt: skip
    assert (r.phase, r.actions) == (Phase.REVERTING, (Action.REVERT_DEPLOYMENT,))


def test_abort_does_not_touch_a_terminal_rollout() -> None:
    s = machine.next_step(MANUAL, State(phase=Phase.PROMOTED, abort="x"), Observation(), poll_s=2.0)
    assert s.phase is Phase.PROMOTED


def test_the_approval_ttl_comes_from_the_environment() -> None:
    assert OperatorConfig().approval_ttl_s == 72 * 3600
    assert OperatorConfig.from_env({"KVGATE_APPROVAL_TTL": "30m"}).approval_ttl_s == 1800
    assert OperatorConfig.from_env({"KVGATE_APPROVAL_TTL": "never"}).approval_ttl_s is None
    assert OperatorConfig.from_env({"KVGATE_APPROVAL_IDENTITY": "1"}).approval_identity
    with pytest.raises(SpecError, match="KVGATE_APPROVAL_TTL"):
        OperatorConfig.from_env({"KVGATE_APPROVAL_TTL": "soon"})


# --- through the handler, on the fake cluster ----------------------------------------------


def test_abort_while_verifying_reverts_production(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(
        monkeypatch, promotion={"mode": "auto", "verifyWindow": "60s", "verifySamples": 5}
    )

    def abort_when_verifying(w: World) -> None:
        if w.phase == "Verifying":
            w.obj["metadata"]["annotations"] = {
                "kvgate.io/abort": "pager",
                "kvgate.io/aborted-by": "dave",
            }

    world.before_reconcile = abort_when_verifying
    assert world.run() == "RolledBack"
    status = world.obj["status"]
    assert status["reason"] == "Aborted"
    assert status["message"] == "aborted by dave (kvgate.io/abort: pager)"
    assert "Reverting" in world.phases
    world.assert_invariant()  # production is back on the original container


def test_manual_approval_needs_the_recorded_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(
        monkeypatch, promotion={"mode": "manual", "verifyWindow": "4s", "verifySamples": 3}
    )
    world.memo.config = OperatorConfig(poll_interval_s=1, hub_offline=True, approval_identity=True)
    meta = world.obj["metadata"]
    meta["annotations"] = {"kvgate.io/created-by": "alice"}
    for _ in range(100):
        world.reconcile()
        world.now += dt.timedelta(seconds=5)
        if world.phase == "AwaitingApproval":
            break
    config_hash = world.obj["status"]["configHash"]
    # the author's own approval (as if the policy were bypassed) holds
    meta["annotations"].update({"kvgate.io/approve": config_hash, "kvgate.io/approved-by": "alice",
                                "kvgate.io/approved-generation": "1"})  # fmt: skip
    world.reconcile()
    assert world.phase == "AwaitingApproval"
    assert "alice created this rollout" in world.obj["status"]["message"]
    # an approval without the recorded identity holds too
    del meta["annotations"]["kvgate.io/approved-by"]
    world.reconcile()
    assert world.phase == "AwaitingApproval" and "no approver" in world.obj["status"]["message"]
    # another identity's, for this generation, promotes
    meta["annotations"]["kvgate.io/approved-by"] = "carol"
    assert world.run() == "Promoted"
    assert ("Normal", "Approved", f"approved by carol for config {config_hash}") in world.events
    world.assert_invariant()
