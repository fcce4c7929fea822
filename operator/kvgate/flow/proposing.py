"""pullRequest promotion: propose the tested change in Git, wait for the merge, then wait until
the GitOps tool has applied it. The phases of `machine.next_step` after a passing verdict in
`promotion.mode: pullRequest`. Pure.

kvgate never patches the Deployment in this mode and never reverts Git: a merged change reaches
the Deployment through the GitOps tool (Argo CD, Flux) or not at all, and only a Deployment that
carries the tested change (args/env, the verdict annotation, pods on the tested image digest)
is `Promoted`. A pull request closed without a merge ends the rollout `Declined`; one merged
but not applied within `applyDeadline` ends it `Failed` with reason `NotApplied` (Stalled).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvgate.flow.steps import (
    MAX_DELAY_S,
    MIN_DELAY_S,
    Action,
    Event,
    Observation,
    State,
    Step,
    clamp_delay,
    end_step,
)
from kvgate.judge.verdict import Verdict
from kvgate.reasons import Reason
from kvgate.records.status import GateResult, PullRequestStatus
from kvgate.redact import scrub_text
from kvgate.spec.rollout import DEFAULT_APPLY_DEADLINE_S, RolloutSpec
from kvgate.vocabulary import Phase, PromotionMode, PullRequestState

OPENING = "opening"  # the write-ahead state: recorded before the forge is called


def intent(spec: RolloutSpec, config_hash: str) -> PullRequestStatus:
    """What is recorded before the forge is called: where, and for which configuration."""
    pr = spec.promotion.pull_request
    return PullRequestStatus(
        provider=pr.provider.value if pr else None,
        repository=pr.repository if pr else None,
        base_branch=pr.base_branch if pr else None,
        path=pr.path if pr else None,
        config_hash=config_hash or None,
        state=OPENING,
    )


def open_pull_request(status: PullRequestStatus | None) -> PullRequestStatus | None:
    """The recorded pull request if it is (as far as status knows) open; else None."""
    if status is None or status.number is None or status.repository is None:
        return None
    return status if status.state == PullRequestState.OPEN.value else None


def unconfirmed(status: PullRequestStatus | None) -> PullRequestStatus | None:
    """The recorded intent when the forge may hold a pull request whose number never made it
    into status (the operator died between opening and recording it); else None."""
    if (
        status is None
        or status.state != OPENING
        or status.number is not None
        or status.repository is None
        or not status.config_hash
    ):
        return None
    return status


def closing(spec: RolloutSpec, state: State, step: Step) -> Step:
    """`step`, closing the open pull request when it ends the rollout otherwise than through
    it (an abort, an error past the limit, a deadline). A merged one is not closed (Git has
    it); an intent without a number closes what the forge has open from the rollout's branch."""
    pr = open_pull_request(state.pull_request) or unconfirmed(state.pull_request)
    if (
        spec.promotion.mode is not PromotionMode.PULL_REQUEST
        or pr is None
        or not step.terminal
        or step.phase in (Phase.PROMOTED, Phase.DECLINED)
        or Action.CLOSE_PULL_REQUEST in step.actions
    ):
        return step
    return dataclasses.replace(
        step,
        actions=(*step.actions, Action.CLOSE_PULL_REQUEST),
        message=f"{step.message}; closing {_named(pr)} so it is not merged",
    )


def after_verdict(
    spec: RolloutSpec, state: State, verdict: Verdict, gates: tuple[GateResult, ...]
) -> Step:
    """A passing verdict: record the intent (write-ahead); the next reconcile opens the PR."""
    pr = spec.promotion.pull_request
    where = pr.repository if pr else "the GitOps repository"
    message = (
        f"verdict: promote ({verdict.message}); proposing the tested change as a pull request "
        f"on {where} (kvgate does not change the Deployment in pullRequest mode)"
    )
    return Step(
        Phase.PULL_REQUEST_OPEN,
        Reason.OPENING_PULL_REQUEST,
        message,
        actions=(Action.DELETE_CANARIES,),
        events=(Event(Reason.OPENING_PULL_REQUEST, message),),
        gates=gates,
        verdict=verdict,
        pull_request=intent(spec, state.config_hash),
        requeue_s=MIN_DELAY_S,
    )


def opened(
    recorded: PullRequestStatus, *, branch: str, number: int, url: str, now: str
) -> PullRequestStatus:
    """The record once the forge answered: the intent with the branch, number and URL."""
    return dataclasses.replace(
        recorded,
        branch=branch,
        number=number,
        url=url,
        state=PullRequestState.OPEN.value,
        opened_at=recorded.opened_at or now,
    )


def proposal_text(
    *,
    rollout: str,
    namespace: str,
    target: str,
    verdict: str,
    gates: Sequence[GateResult],
    key: str,
    config_hash: str,
    args: Sequence[str],
) -> tuple[str, str]:
    """The pull request's title and body: the verdict table, the key, how to read the report."""
    title = f"kvgate: FP8 KV cache for {namespace}/{target} (verdict {key})"
    rows = "\n".join(
        f"| {g.gate} | {g.outcome.value} | {g.why} | {_cell(g.message)} |" for g in gates
    )
    body = f"""kvgate evaluated this change on paired canaries of Deployment `{target}` \
(rollout `{namespace}/{rollout}`, configuration `{config_hash}`) and the verdict is to promote it.

**Verdict:** {_cell(verdict) or "promote"}

| gate | outcome | reason | detail |
|---|---|---|---|
{rows}

Tested args: `{" ".join(args)}`

The verdict key `{key}` (engine image digest and version, model, KV dtype, attention backend, the
tested args/env, the eval policy) is set as the pod-template annotation `kvgate.io/verdict`: the
pods that run this change name the evaluation they were promoted on.

Read the full report with `kvgate report {rollout} -n {namespace}`, or in the ConfigMap
`{rollout}-report` (report.txt, report.html, status.json).

kvgate wrote only this file on this branch; it never changes the Deployment itself. Once this is
merged, the rollout waits until your GitOps tool has applied it, then reads `Promoted`.
Closing it unmerged ends the rollout `Declined`.
"""
    return title, scrub_text(body)


def _cell(text: str) -> str:
    """One table cell: one line, no pipe."""
    return " ".join(text.split()).replace("|", "/")[:300]


def _named(recorded: PullRequestStatus | None) -> str:
    if recorded is not None and recorded.number is None and recorded.state == OPENING:
        return "any pull request opened for it"  # the number was never recorded
    if recorded is None or recorded.number is None:
        return "the pull request"
    url = f" ({recorded.url})" if recorded.url else ""
    return f"pull request #{recorded.number}{url}"


def pull_request_open(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    recorded = state.pull_request
    live = obs.live
    if (recorded is None or recorded.number is None) and live is not None and not live.as_evaluated:
        changed = ", ".join(live.differences) or "container"
        return end_step(
            Phase.FAILED,
            Reason.TARGET_CHANGED,
            f"Deployment {spec.target.name} changed since it was evaluated ({changed}); not "
            "proposing evidence about another config: start a new rollout",
        )
    if recorded is None or recorded.number is None:
        # The intent is recorded, the PR is not (yet, or the operator died after opening it):
        # open or update it; the forge finds an open PR of the branch, so none is duplicated.
        return Step(
            Phase.PULL_REQUEST_OPEN,
            Reason.OPENING_PULL_REQUEST,
            "opening the pull request",
            actions=(Action.OPEN_PULL_REQUEST,),
            pull_request=recorded or intent(spec, state.config_hash),
            requeue_s=MIN_DELAY_S,
        )
    seen = obs.pull_request
    if seen is None:
        return Step(
            Phase.PULL_REQUEST_OPEN,
            Reason.PULL_REQUEST_OPEN,
            f"{_named(recorded)} is open; reading its state",
            requeue_s=MIN_DELAY_S,
        )
    if seen.state is PullRequestState.CLOSED:
        return end_step(
            Phase.DECLINED,
            Reason.DECLINED,
            f"{_named(recorded)} was closed without a merge; the Deployment is unchanged "
            "(change the spec to evaluate and propose again)",
            pull_request=PullRequestStatus(state=PullRequestState.CLOSED.value),
        )
    if seen.state is PullRequestState.MERGED:
        sha = seen.merge_sha or "an unknown commit"
        message = (
            f"{_named(recorded)} was merged as {sha}; waiting for the GitOps tool to apply it "
            "to the Deployment"
        )
        return Step(
            Phase.PULL_REQUEST_MERGED,
            Reason.PULL_REQUEST_MERGED,
            message,
            events=(Event(Reason.PULL_REQUEST_MERGED, message),),
            pull_request=PullRequestStatus(
                state=PullRequestState.MERGED.value, merge_sha=seen.merge_sha
            ),
            requeue_s=MIN_DELAY_S,
        )
    return Step(
        Phase.PULL_REQUEST_OPEN,
        Reason.PULL_REQUEST_OPEN,
        f"{_named(recorded)} is open; waiting for it to be merged or closed",
        pull_request=(
            PullRequestStatus(state=PullRequestState.OPEN.value)
            if recorded.state != PullRequestState.OPEN.value
            else None
        ),
        requeue_s=MAX_DELAY_S,
    )


def pull_request_merged(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    recorded = state.pull_request
    sha = (recorded.merge_sha if recorded else None) or "the merge commit"
    if obs.applied:
        return end_step(
            Phase.PROMOTED,
            Reason.PROMOTED,
            f"Deployment {spec.target.name} carries the tested change from {_named(recorded)} "
            f"({sha}), applied by the GitOps tool",
        )
    pr = spec.promotion.pull_request
    deadline = pr.apply_deadline_s if pr else DEFAULT_APPLY_DEADLINE_S
    gap = obs.apply_gap or "the Deployment does not carry the tested change"
    if state.phase_elapsed_s >= deadline:
        return end_step(
            Phase.FAILED,
            Reason.NOT_APPLIED,
            f"{_named(recorded)} was merged ({sha}) but not applied within {deadline:g}s: "
            f"{gap}; check the GitOps tool's sync of that commit (kvgate never applies it)",
        )
    return Step(
        Phase.PULL_REQUEST_MERGED,
        Reason.WAITING_FOR_GITOPS,
        f"waiting for the GitOps tool to apply {sha}: {gap}",
        requeue_s=clamp_delay(poll_s),
    )
