"""pullRequest promotion, the pure phases: PullRequestOpen -> PullRequestMerged -> Promoted,
Declined when closed, Failed/NotApplied (Stalled) past the apply deadline; never a patch."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.errors import SpecError
from kvgate.flow import machine, proposing
from kvgate.flow.steps import Action, LiveTarget, Observation, PullRequestSeen, State, Step
from kvgate.judge.verdict import Decision, Verdict
from kvgate.reasons import Reason
from kvgate.records.status import PullRequestStatus
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Outcome, Phase, PullRequestState

PR: dict[str, Any] = {
    "provider": "gitea",
    "apiUrl": "http://127.0.0.1:3000/api/v1",
    "repository": "ops/serving",
    "path": "apps/vllm/kvgate-patch.yaml",
    "tokenSecretRef": {"name": "forge-token"},
    "applyDeadline": "10m",
}
SPEC = RolloutSpec.from_dict(
    {"targetRef": {"name": "vllm"}, "promotion": {"mode": "pullRequest", "pullRequest": PR}}
)
OPENED = PullRequestStatus(
    provider="gitea",
    repository="ops/serving",
    branch="kvgate/r-0123456789abcdef",
    config_hash="0123456789abcdef",
    number=7,
    url="http://forge/ops/serving/pulls/7",
    state="open",
)
PASS = Verdict(Decision.PROMOTE, Outcome.SUCCESSFUL, (), "all gates passed")
NEVER = (Action.PATCH_DEPLOYMENT, Action.REVERT_DEPLOYMENT)


def step(phase: Phase, obs: Observation | None = None, **state: Any) -> Step:
    return machine.next_step(
        SPEC, State(phase, config_hash="0123456789abcdef", **state), obs or Observation(),
        poll_s=5.0,
    )  # fmt: skip


def test_a_passing_verdict_records_the_intent_before_any_forge_call() -> None:
    s = proposing.after_verdict(SPEC, State(Phase.EVALUATING, config_hash="0123456789abcdef"),
                                PASS, ())  # fmt: skip
    assert (s.phase, s.reason) == (Phase.PULL_REQUEST_OPEN, Reason.OPENING_PULL_REQUEST)
    # write-ahead: the intent is recorded, the PR is opened on the next reconcile
    assert Action.OPEN_PULL_REQUEST not in s.actions
    assert not set(NEVER) & set(s.actions)
    assert s.pull_request == PullRequestStatus(
        provider="gitea",
        repository="ops/serving",
        base_branch="main",
        path="apps/vllm/kvgate-patch.yaml",
        config_hash="0123456789abcdef",
        state="opening",
    )
    assert s.verdict is PASS


def test_the_intent_without_a_number_opens_the_pull_request() -> None:
    intent = proposing.intent(SPEC, "0123456789abcdef")
    s = step(Phase.PULL_REQUEST_OPEN, pull_request=intent)
    assert s.phase is Phase.PULL_REQUEST_OPEN
    assert s.actions == (Action.OPEN_PULL_REQUEST,)


def test_an_open_pull_request_waits_for_a_person() -> None:
    seen = PullRequestSeen(7, OPENED.url or "", PullRequestState.OPEN)
    s = step(Phase.PULL_REQUEST_OPEN, Observation(pull_request=seen), pull_request=OPENED)
    assert (s.phase, s.reason, s.actions) == (Phase.PULL_REQUEST_OPEN, Reason.PULL_REQUEST_OPEN, ())
    assert "#7" in s.message and not s.terminal


def test_closed_unmerged_is_declined_and_final() -> None:
    seen = PullRequestSeen(7, OPENED.url or "", PullRequestState.CLOSED)
    s = step(Phase.PULL_REQUEST_OPEN, Observation(pull_request=seen), pull_request=OPENED)
    assert (s.phase, s.reason) == (Phase.DECLINED, Reason.DECLINED)
    assert s.terminal and Phase.DECLINED.terminal
    assert s.pull_request is not None and s.pull_request.state == "closed"
    assert {e.reason for e in s.events} == {Reason.DECLINED}


def test_merged_records_the_merge_sha_and_waits_for_gitops() -> None:
    seen = PullRequestSeen(7, OPENED.url or "", PullRequestState.MERGED, merge_sha="abc123")
    s = step(Phase.PULL_REQUEST_OPEN, Observation(pull_request=seen), pull_request=OPENED)
    assert (s.phase, s.reason) == (Phase.PULL_REQUEST_MERGED, Reason.PULL_REQUEST_MERGED)
    assert s.pull_request == PullRequestStatus(state="merged", merge_sha="abc123")
    assert "abc123" in s.message


MERGED = PullRequestStatus(number=7, url="http://forge/pulls/7", state="merged", merge_sha="abc123")


def test_applied_by_gitops_is_promoted() -> None:
    s = step(Phase.PULL_REQUEST_MERGED, Observation(applied=True), pull_request=MERGED)
    assert (s.phase, s.reason) == (Phase.PROMOTED, Reason.PROMOTED)
    assert not set(NEVER) & set(s.actions)


def test_not_applied_yet_waits_and_says_what_is_missing() -> None:
    obs = Observation(apply_gap="the pod template has no kvgate.io/verdict annotation")
    s = step(Phase.PULL_REQUEST_MERGED, obs, pull_request=MERGED, phase_elapsed_s=599.0)
    assert (s.phase, s.reason) == (Phase.PULL_REQUEST_MERGED, Reason.WAITING_FOR_GITOPS)
    assert "kvgate.io/verdict" in s.message


def test_merged_but_never_applied_stalls_at_the_deadline_naming_the_gap() -> None:
    obs = Observation(apply_gap="the container's args differ from the tested ones")
    s = step(Phase.PULL_REQUEST_MERGED, obs, pull_request=MERGED, phase_elapsed_s=600.0)
    assert (s.phase, s.reason) == (Phase.FAILED, Reason.NOT_APPLIED)
    assert s.reason.stalls
    assert "args differ" in s.message and "abc123" in s.message


@pytest.mark.parametrize("phase", [Phase.PULL_REQUEST_OPEN, Phase.PULL_REQUEST_MERGED])
def test_an_abort_never_reverts_the_deployment(phase: Phase) -> None:
    live = LiveTarget(exists=True, carries_candidate=True, ours_present=True)
    s = step(phase, Observation(live=live), pull_request=MERGED, abort="by alice: stop")
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, Reason.ABORTED)
    assert s.revert is None and not set(NEVER) & set(s.actions)
    assert "left as it is" in s.message


def test_a_candidate_found_before_the_verdict_is_not_reverted_either() -> None:
    live = LiveTarget(exists=True, carries_candidate=True, ours_present=True)
    s = step(Phase.CANARY, Observation(live=live))
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, Reason.UNEXPECTED_PATCH)
    assert s.revert is None and not set(NEVER) & set(s.actions)


def test_helm_values_carry_the_full_args_the_changed_env_and_the_annotation() -> None:
    import yaml

    from kvgate.change import gitops

    previous = {"args": ["--port", "8000"], "env": [{"name": "HF_HOME", "value": "/cache"}]}
    candidate = {
        "args": ["--port", "8000", "--kv-cache-dtype", "fp8"],
        "env": [{"name": "HF_HOME", "value": "/cache"}, {"name": "VLLM_X", "value": "1"}],
    }
    text = gitops.render_helm_values(
        values_key="vllm.container", previous=previous, candidate=candidate, verdict_key="sha256:ab"
    )
    assert text.startswith("# Written by kvgate")
    assert yaml.safe_load(text) == {
        "vllm": {
            "container": {
                "args": ["--port", "8000", "--kv-cache-dtype", "fp8"],
                "env": [{"name": "VLLM_X", "value": "1"}],
                "podAnnotations": {"kvgate.io/verdict": "sha256:ab"},
            }
        }
    }
    with pytest.raises(SpecError, match="removes env HF_HOME"):
        gitops.render_helm_values(
            values_key="v", previous=previous, candidate={"args": []}, verdict_key="k"
        )


def test_the_pr_body_has_the_verdict_table_the_key_and_the_report() -> None:
    from kvgate.records.status import GateResult

    gate = GateResult("accuracy", Outcome.SUCCESSFUL, Reason.ACCURACY_NON_INFERIOR, "a | b\nc")
    title, body = proposing.proposal_text(
        rollout="r", namespace="ns", target="vllm", verdict="all gates passed", gates=(gate,),
        key="sha256:0123", config_hash="abc", args=("--kv-cache-dtype", "fp8"),
    )  # fmt: skip
    assert "ns/vllm" in title and "sha256:0123" in title
    assert "| accuracy | Successful | AccuracyNonInferior | a / b c |" in body
    assert "kvgate report r -n ns" in body and "`--kv-cache-dtype fp8`" in body


def test_a_target_changed_since_the_eval_is_not_proposed() -> None:
    live = LiveTarget(exists=True, as_evaluated=False, differences=("image",))
    s = step(Phase.PULL_REQUEST_OPEN, Observation(live=live))
    assert (s.phase, s.reason) == (Phase.FAILED, Reason.TARGET_CHANGED)
    assert Action.OPEN_PULL_REQUEST not in s.actions


def test_giving_up_with_an_open_pull_request_closes_it() -> None:
    # errors past the limit (a forge that stays down) end the rollout; the PR it left open
    # must not stay mergeable
    state = State(Phase.PULL_REQUEST_OPEN, config_hash="0123456789abcdef", pull_request=OPENED)
    ended = machine.give_up(SPEC, state, "forge down", 31, limit=30)
    assert ended is not None and ended.terminal
    assert Action.CLOSE_PULL_REQUEST in ended.actions
    assert machine.give_up(SPEC, state, "forge down", 1, limit=30) is None  # still retrying


def test_an_end_without_an_open_pull_request_closes_nothing() -> None:
    for recorded in (None, PullRequestStatus(state=PullRequestState.MERGED.value, number=3,
                                             repository="acme/deploy")):  # fmt: skip
        state = State(Phase.PULL_REQUEST_OPEN, pull_request=recorded)
        ended = machine.give_up(SPEC, state, "forge down", 31, limit=30)
        assert ended is not None and Action.CLOSE_PULL_REQUEST not in ended.actions


def test_an_end_with_an_intent_but_no_number_closes_what_the_forge_may_hold() -> None:
    # the operator died between opening the PR and recording its number: an end must still
    # close it (the controller finds it by the rollout's branch), not leave it mergeable
    intent = proposing.intent(SPEC, "0123456789abcdef")
    state = State(Phase.PULL_REQUEST_OPEN, config_hash="0123456789abcdef", pull_request=intent,
                  abort="wrong model")  # fmt: skip
    s = machine.next_step(SPEC, state, Observation(), poll_s=5.0)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, Reason.ABORTED)
    assert Action.CLOSE_PULL_REQUEST in s.actions
    assert "closing any pull request opened for it" in s.message
    ended = machine.give_up(SPEC, State(Phase.PULL_REQUEST_OPEN, pull_request=intent), "x", 31,
                            limit=30)  # fmt: skip
    assert ended is not None and Action.CLOSE_PULL_REQUEST in ended.actions
    # an intent that names no configuration cannot name a branch: nothing to look for
    blank = PullRequestStatus(repository="ops/serving", state="opening")
    assert proposing.unconfirmed(blank) is None
    assert proposing.unconfirmed(OPENED) is None  # recorded: closed by its number
