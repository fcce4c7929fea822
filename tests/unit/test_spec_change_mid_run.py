"""A new spec while a run is under way (kvgate.flow.superseding): before anything is patched or
merged the run ends at once (its children deleted, its open pull request closed) and a new run
evaluates the new spec; once the Deployment is patched or the pull request merged, the run
finishes first and the new spec gets its run after the end. Against the in-memory cluster and
forge, with the operator killed at every write of the hand-over."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest
from test_controller import TERMINAL, World
from test_controller_pull_request import PATH, PullRequestWorld, opened

from kvgate.adapters.forge import RestForge
from kvgate.flow import superseding
from kvgate.flow.proposing import OPENING
from kvgate.flow.steps import Action, Observation, PullRequestSeen, State
from kvgate.reasons import Reason
from kvgate.records.status import PullRequestStatus, RolloutStatus
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Phase, PromotionMode, PullRequestState

SAMPLER_OFF = [{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"}]


def new_spec(w: World) -> None:
    """What `kubectl apply` of an edited rollout does: a new spec, a new generation."""
    w.obj["spec"]["extraEnv"] = copy.deepcopy(SAMPLER_OFF)
    w.obj["metadata"]["generation"] += 1


def until(w: World, phase: str, steps: int = 100) -> None:
    for _ in range(steps):
        if w.phase == phase:
            return
        w.reconcile()
        w.now += dt.timedelta(seconds=1)
    raise AssertionError(f"never {phase}: {w.obj.get('status')}")


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


# --- the rule -------------------------------------------------------------------------------


def spec_of(mode: str = "auto") -> RolloutSpec:
    promotion: dict[str, Any] = {"mode": mode}
    if mode == "pullRequest":
        promotion["pullRequest"] = {
            "provider": "github",
            "apiUrl": "https://api.github.com",
            "repository": "o/r",
            "path": "p.yaml",
            "tokenSecretRef": {"name": "t"},
        }
    return RolloutSpec.from_dict(
        {"targetRef": {"name": "vllm"}, "kvCacheDtype": "fp8", "promotion": promotion}
    )


@pytest.mark.parametrize("phase", sorted(superseding.SUPERSEDABLE))
def test_a_newer_spec_supersedes_every_phase_before_a_change(phase: Phase) -> None:
    step = superseding.superseded(spec_of(), State(phase, spec_changed_to=3), Observation())
    assert step is not None and step.new_run and not step.terminal
    assert (step.phase, step.reason) == (Phase.PENDING, Reason.SPEC_CHANGED)
    assert set(step.actions) == {Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB}
    assert f"generation 3) while {phase.value}" in step.message
    assert [e.reason for e in step.events] == [Reason.SPEC_CHANGED]


@pytest.mark.parametrize(
    "phase",
    sorted(set(Phase) - superseding.SUPERSEDABLE),
)
def test_once_patched_merged_or_ended_the_run_finishes_first(phase: Phase) -> None:
    # Promoting, Verifying, Reverting, PullRequestMerged: kvgate's change is on its way, and
    # the write-ahead rules finish it; Pending has no evidence yet; the ends are ended.
    assert superseding.superseded(spec_of(), State(phase, spec_changed_to=3), Observation()) is None


def test_the_same_generation_supersedes_nothing() -> None:
    assert superseding.superseded(spec_of(), State(Phase.EVALUATING), Observation()) is None


OPEN = PullRequestStatus(repository="o/r", number=7, state=PullRequestState.OPEN.value)
UNRECORDED = PullRequestStatus(repository="o/r", config_hash="ab12", state=OPENING)


@pytest.mark.parametrize("pr", [OPEN, UNRECORDED], ids=["recorded", "unrecorded"])
def test_an_open_pull_request_is_closed_with_the_run(pr: PullRequestStatus) -> None:
    state = State(Phase.PULL_REQUEST_OPEN, spec_changed_to=2, pull_request=pr)
    step = superseding.superseded(spec_of("pullRequest"), state, Observation())
    assert step is not None and Action.CLOSE_PULL_REQUEST in step.actions
    assert step.message.endswith("closing the pull request it opened")


def test_a_pull_request_seen_or_recorded_merged_is_followed_not_superseded() -> None:
    seen = Observation(pull_request=PullRequestSeen(7, "u", PullRequestState.MERGED, "e" * 40))
    state = State(Phase.PULL_REQUEST_OPEN, spec_changed_to=2, pull_request=OPEN)
    assert superseding.superseded(spec_of("pullRequest"), state, seen) is None
    merged = PullRequestStatus(repository="o/r", number=7, state=PullRequestState.MERGED.value)
    state = State(Phase.PULL_REQUEST_OPEN, spec_changed_to=2, pull_request=merged)
    assert superseding.superseded(spec_of("pullRequest"), state, Observation()) is None


def test_outside_pull_request_mode_nothing_is_closed() -> None:
    state = State(Phase.AWAITING_APPROVAL, spec_changed_to=2, pull_request=OPEN)
    step = superseding.superseded(spec_of("manual"), state, Observation())
    assert step is not None and Action.CLOSE_PULL_REQUEST not in step.actions
    assert spec_of("manual").promotion.mode is PromotionMode.MANUAL


# --- the controller, auto mode --------------------------------------------------------------


def evaluating_world(monkeypatch: pytest.MonkeyPatch) -> World:
    w = World(monkeypatch)
    w.kube.hold_evals = True
    until(w, "Evaluating")
    w.reconcile()  # the eval Job exists
    assert w.kube.get("Job", "r-eval-1") is not None
    return w


def test_a_new_spec_while_evaluating_starts_a_new_run_that_promotes_the_new_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a run evaluating the first spec
    w = evaluating_world(monkeypatch)
    first_hash = w.obj["status"]["configHash"]
    # WHEN the rollout is edited
    new_spec(w)
    w.reconcile()
    # THEN the run ends at once: nothing of it is kept, its children are due for deletion
    status = w.obj["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "SpecChanged")
    assert "generation 2) while Evaluating" in status["message"]
    for gone in ("gates", "eval", "arms", "configHash", "runGeneration", "verdict", "candidate"):
        assert not status.get(gone), gone
    assert sorted(status["pendingActions"]) == ["DeleteCanaries", "DeleteEvalJob"]
    assert status["observedGeneration"] == 2
    assert ("Normal", "SpecChanged", status["message"]) in w.events
    # AND the next run deletes them first, evaluates the new spec, and promotes it
    candidates: list[dict[str, str]] = []

    def watch(w: World) -> None:
        pod = w.kube.get("Pod", "r-candidate")
        if pod is not None:
            candidates.append(env_of(pod["spec"]["containers"][0]))
        if w.phase == "Evaluating" and w.obj["status"].get("runGeneration") == 2:
            w.kube.finish_evals()

    w.before_reconcile = watch
    w.kube.hold_evals = False
    w.reconcile()
    assert w.kube.get("Pod", "r-candidate") is None and w.kube.get("Job", "r-eval-1") is None
    assert w.run() == "Promoted"
    w.assert_invariant()  # the Deployment carries the candidate of the new spec
    assert env_of(w.kube.container())["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert candidates and candidates[-1].get("VLLM_USE_FLASHINFER_SAMPLER") == "0"
    status = w.obj["status"]
    assert status["runGeneration"] == 2 and status["configHash"] != first_hash
    assert w.phases[w.phases.index("Pending") :][:4] == [
        "Pending",
        "Preflight",
        "Canary",
        "Evaluating",
    ]
    assert w.reasons().count("Promoting") == 1 and w.reasons().count("RolledBack") == 0


def test_an_abort_with_the_new_spec_aborts(monkeypatch: pytest.MonkeyPatch) -> None:
    # kvgate.io/abort stays in force across spec changes: a new spec is aborted at once.
    w = evaluating_world(monkeypatch)
    new_spec(w)
    w.obj["metadata"].setdefault("annotations", {})["kvgate.io/abort"] = "stop"
    assert w.run() == "RolledBack"
    assert w.obj["status"]["reason"] == "Aborted" and "SpecChanged" not in w.reasons()
    w.assert_invariant()


def test_a_new_spec_while_verifying_waits_for_the_end_then_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the first spec's candidate is on the Deployment, being verified
    w = World(monkeypatch)
    until(w, "Verifying")
    before = env_of(w.kube.container())
    # WHEN the rollout is edited
    new_spec(w)
    # THEN the run finishes as it was going (one patch, its own candidate, never half-changed)
    for _ in range(60):
        w.reconcile()
        w.now += dt.timedelta(seconds=2)
        if w.phase in TERMINAL:
            break
    assert w.phase == "Promoted" and "SpecChanged" not in w.reasons()
    assert env_of(w.kube.container()) == before  # the first spec's candidate, not the new one
    assert w.obj["status"]["runGeneration"] == 1 and w.obj["status"]["observedGeneration"] == 2
    # AND then a new run starts for the new spec
    w.reconcile()
    status = w.obj["status"]
    assert status["phase"] != "Promoted" and status.get("runGeneration") == 2, status
    assert w.reasons().count("Promoted") == 1


# --- the controller, pullRequest mode -------------------------------------------------------


def test_a_new_spec_while_the_pr_is_open_closes_it_and_proposes_the_new_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the first spec's change proposed as pull request #1
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    first_branch = w.forge.pulls[0]["head"]
    # WHEN the rollout is edited
    new_spec(w)
    w.reconcile()
    # THEN #1 is closed with a comment saying why, and the run starts again
    assert (w.phase, w.status["reason"]) == ("Pending", "SpecChanged")
    assert w.forge.pulls[0]["state"] == "closed"
    comment = w.forge.pulls[0]["comments"][-1]
    assert "changed (generation 2) before it was merged" in comment
    assert "pullRequest" not in w.status
    assert [m for _, r, m in w.events if r == "PullRequestClosed"] == [
        "closed pull request #1 on acme/deploy"
    ]
    # AND the new spec, once tested, is proposed on its own branch as #2
    w.until(lambda w: opened(w) and w.status["pullRequest"]["number"] == 2)
    second = w.forge.pulls[1]
    assert second["state"] == "open" and second["head"] != first_branch
    text = w.forge.files[(second["head"], PATH)].decode()
    assert "VLLM_USE_FLASHINFER_SAMPLER" in text
    assert w.forge.pulls[0]["state"] == "closed"
    assert w.deployment_patches == []  # kvgate never patches in this mode


def test_a_pr_merged_before_the_close_is_followed_to_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN #1 open WHEN the spec changes and someone merges #1 just before kvgate closes it
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    new_spec(w)
    real_close = RestForge.close_pull_request

    def merged_first(forge: RestForge, repo: str, number: int, comment: str) -> Any:
        w.forge.pulls[0].update(state="merged", merge_sha="e" * 40)  # the race
        return real_close(forge, repo, number, comment)

    monkeypatch.setattr(RestForge, "close_pull_request", merged_first)
    w.reconcile()
    # THEN the run is not thrown away: Git has its change, so it follows the merge
    assert w.phase == "PullRequestOpen" and w.status["pullRequest"]["state"] == "merged"
    assert "SpecChanged" not in w.reasons()
    assert "followi" in w.status["message"]
    w.until(lambda w: w.phase == "PullRequestMerged")
    w.gitops_applies()
    w.until(lambda w: w.phase == "Promoted")
    assert w.status["runGeneration"] == 1
    # AND then the new spec gets its run
    w.reconcile()
    assert w.status.get("runGeneration") == 2 and w.phase != "Promoted"


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_an_operator_killed_at_every_write_of_the_hand_over_ends_the_same(
    monkeypatch: pytest.MonkeyPatch, after: bool
) -> None:
    # The hand-over's writes: the forge's close, then (next reconcile) the deletions of the old
    # run's pods and Jobs. Killed before or after any of them, the restarted operator closes
    # #1 once, never leaves a pod of the old spec running, and the new spec is proposed.
    clean = PullRequestWorld(monkeypatch)
    clean.until(opened)
    new_spec(clean)
    start = clean.kube.mutations
    clean.until(lambda w: opened(w) and w.status["pullRequest"]["number"] == 2)
    writes = clean.kube.mutations - start
    assert writes >= 2
    for k in range(1, writes + 1):
        w = PullRequestWorld(monkeypatch)
        w.until(opened)
        new_spec(w)
        w.kube.crash_at, w.kube.crash_after = w.kube.mutations + k, after
        w.until(lambda w: opened(w) and w.status["pullRequest"]["number"] == 2)
        assert w.crashes == 1, f"write {k} was never reached"
        assert [p["state"] for p in w.forge.pulls] == ["closed", "open"], k
        assert len(w.forge.pulls[0]["comments"]) == 1
        assert w.status["runGeneration"] == 2 and w.deployment_patches == []


def test_a_new_spec_after_the_end_starts_a_run_that_keeps_nothing_of_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a run that ended RolledBack after its promoted pods crashed (its gates all passed)
    w = World(monkeypatch)
    w.kube.crash_new_pods = True
    assert w.run() == "RolledBack"
    last = copy.deepcopy(w.obj["status"])
    assert last["gates"]["accuracy"] and last["verdict"] and last["finishedAt"]
    # WHEN the rollout is edited
    w.kube.crash_new_pods = False
    new_spec(w)
    w.reconcile()
    # THEN the new run's status has none of the last run's findings: no gate can vote twice
    status = w.obj["status"]
    assert status["phase"] in ("Pending", "Preflight") and status["runGeneration"] == 2
    for gone in ("verdict", "finishedAt", "revert", "promotion", "eval", "arms"):
        assert gone not in status, gone
    assert "accuracy" not in (status.get("gates") or {})
    # AND it reaches its own end, on the new spec
    assert w.run() == "Promoted"
    w.assert_invariant()
    assert env_of(w.kube.container())["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


@pytest.mark.parametrize(
    ("status", "generation", "newer"),
    [
        ({"runGeneration": 1, "observedGeneration": 3}, 3, 3),  # edited while it had to finish
        ({"runGeneration": 3, "observedGeneration": 3}, 3, None),
        ({"observedGeneration": 2}, 3, 3),  # a status from before runGeneration
        ({}, 3, None),
        ({"runGeneration": "1"}, 3, None),  # an edited status: unknown, never a new run
        ({"runGeneration": 4}, 3, None),  # never backwards
        ({"runGeneration": 1}, None, None),
    ],
)
def test_newer_generation_reads_only_what_it_can_trust(
    status: dict[str, Any], generation: int | None, newer: int | None
) -> None:
    assert superseding.newer_generation(RolloutStatus.from_dict(status), generation) == newer
