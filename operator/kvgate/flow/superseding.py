"""A new spec while a run is under way: does it end the run now, and with what step. Pure.

A run's evidence (canaries, eval, load, verdict, an open pull request) is for the spec of the
generation it started at (`status.runGeneration`). Like a new revision in Argo Rollouts or
Flagger, a newer spec supersedes the run while nothing has been changed yet: its children are
deleted (write-ahead, as at any end), an open pull request is closed with a comment, and a new
run starts in Pending for the new spec. Once kvgate has patched the Deployment, or a pull
request was merged, the run finishes first (nothing is left half-changed); a new run for the
newer spec starts after its end.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from kvgate.flow import proposing
from kvgate.flow.steps import MIN_DELAY_S, Action, Event, Observation, State, Step
from kvgate.reasons import Reason
from kvgate.records.status import PullRequestStatus, RolloutStatus
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Phase, PromotionMode, PullRequestState

# Nothing of the run is on the Deployment or merged in Git in these phases.
SUPERSEDABLE: Final = frozenset(
    {
        Phase.PREFLIGHT,
        Phase.CANARY,
        Phase.EVALUATING,
        Phase.MEASURING,
        Phase.AWAITING_APPROVAL,
        Phase.PULL_REQUEST_OPEN,
    }
)


def newer_generation(status: RolloutStatus, generation: int | None) -> int | None:
    """`generation` when it is newer than the one the run in `status` evaluates (runGeneration;
    a status from before it was recorded: observedGeneration); None when the same or unknown."""
    run = status.observed_generation if status.run_generation is None else status.run_generation
    if isinstance(run, int) and isinstance(generation, int) and generation > run:
        return generation
    return None


def merged(recorded: PullRequestStatus | None) -> bool:
    """Whether status records the pull request as merged (Git has the change)."""
    return recorded is not None and recorded.state == PullRequestState.MERGED.value


def _merged(state: State, obs: Observation) -> bool:
    seen = obs.pull_request
    return (seen is not None and seen.state is PullRequestState.MERGED) or merged(
        state.pull_request
    )


def superseded(spec: RolloutSpec, state: State, obs: Observation) -> Step | None:
    """The step that ends this run for a newer spec and starts the next (None: it goes on)."""
    newer = state.spec_changed_to
    if newer is None or state.phase not in SUPERSEDABLE or _merged(state, obs):
        return None
    message = (
        f"the spec changed (generation {newer}) while {state.phase.value}: this run's evidence "
        "is for the earlier spec, so it ends here and a new run evaluates the new one"
    )
    actions = [Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB]
    pr = proposing.open_pull_request(state.pull_request) or proposing.unconfirmed(
        state.pull_request
    )
    if spec.promotion.mode is PromotionMode.PULL_REQUEST and pr is not None:
        actions.append(Action.CLOSE_PULL_REQUEST)
        message += "; closing the pull request it opened"
    return Step(
        Phase.PENDING,
        Reason.SPEC_CHANGED,
        message,
        actions=tuple(actions),
        events=(Event(Reason.SPEC_CHANGED, message),),
        requeue_s=MIN_DELAY_S,
        new_run=True,
    )


def merged_meanwhile(step: Step) -> Step:
    """The pull request was merged before kvgate could close it: the run follows the merge to
    its end (the GitOps tool applies it), and the newer spec gets a run after that."""
    return dataclasses.replace(
        step,
        phase=Phase.PULL_REQUEST_OPEN,
        reason=Reason.PULL_REQUEST_OPEN,
        message=(
            "the spec changed, but the pull request was merged before kvgate could close it: "
            "following the merge; the new spec is evaluated once this run ends"
        ),
        events=(),
        new_run=False,
    )
