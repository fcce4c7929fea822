"""pullRequest promotion's I/O: the forge token, opening the pull request, reading it back, and
whether the GitOps tool has applied the merged change to the live Deployment.

The token is read from the opted-in Secret for one call and dropped: it is never stored in
status, an Event or a log line (forge errors never carry it). kvgate writes one file on one
branch, `kvgate/<rollout>-<configHash>`; opening is idempotent (the forge updates the open pull
request of that branch), so an operator that dies between opening and recording opens nothing
twice. The Deployment is only read here, never written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

from kvgate import redact
from kvgate.adapters.forge import RestForge, forge_for
from kvgate.change import gitops, manifests
from kvgate.controller.candidate import derive_candidate
from kvgate.controller.changes import NOTHING, StatusUpdate
from kvgate.controller.context import Ctx
from kvgate.controller.seen import Seen, evaluated_live, live_key
from kvgate.controller.sources import FORGE_TOKEN_FIELD
from kvgate.errors import InputError, KvgateError
from kvgate.evidence import kubeobjects
from kvgate.flow import proposing
from kvgate.flow.steps import Observation, PullRequestSeen, Step
from kvgate.judge import verdictkey
from kvgate.reasons import Reason
from kvgate.records.status import PullRequestStatus
from kvgate.records.timestamps import iso
from kvgate.spec.rollout import PullRequestSpec
from kvgate.vocabulary import GitFileKind, Phase, PullRequestState

# The forge client for (provider, apiUrl, token); tests swap in one over an in-memory forge.
FORGE_FOR: Callable[[str, str, str], RestForge] = forge_for


def _pull_request_spec(ctx: Ctx) -> PullRequestSpec:
    pr = ctx.spec.promotion.pull_request
    if pr is None:
        raise KvgateError("spec.promotion.pullRequest: missing in pullRequest mode")
    return pr


@contextlib.contextmanager
def _forge(ctx: Ctx) -> Iterator[RestForge]:
    pr = _pull_request_spec(ctx)
    if not ctx.config.forge_token_secrets:
        raise InputError(f"{FORGE_TOKEN_FIELD}: this operator does not use forge-token Secrets")
    secret = pr.token_secret
    token = ctx.kube.read_forge_token(
        ctx.namespace, secret.name, secret.key, api_url=pr.api_url, repository=pr.repository
    )
    forge = FORGE_FOR(pr.provider.value, pr.api_url, token)
    del token
    try:
        yield forge
    finally:
        forge.close()


def proposed_file(ctx: Ctx, pr: PullRequestSpec, key: str) -> str:
    """The file kvgate owns, rendered from the live (evaluated) container and the spec."""
    _, live = evaluated_live(ctx)
    candidate = manifests.container_config(derive_candidate(ctx, live))
    previous = manifests.container_config(live)
    if pr.kind is GitFileKind.HELM_VALUES:
        return gitops.render_helm_values(
            values_key=pr.values_key or "",
            previous=previous,
            candidate=candidate,
            verdict_key=key,
        )
    return gitops.render_kustomize_patch(
        deployment=ctx.spec.target.name,
        container=str(ctx.so_far.container or live.get("name") or ""),
        previous=previous,
        candidate=candidate,
        verdict_key=key,
    )


def open_pull_request(ctx: Ctx, step: Step) -> StatusUpdate:
    """Open (or update) the pull request the recorded intent names; record what the forge says.
    The branch is a function of the rollout and the config hash, so a second call (an operator
    that died before recording) updates the same pull request."""
    pr = _pull_request_spec(ctx)
    config_hash = ctx.so_far.config_hash or ""
    key = verdictkey.recorded(ctx.so_far)
    if key is None:
        raise KvgateError("no verdict key recorded with the verdict; not proposing")
    branch = gitops.branch_name(ctx.name, config_hash)
    files = {pr.path: proposed_file(ctx, pr, key.digest)}
    gates = ctx.so_far.gates
    title, body = proposing.proposal_text(
        rollout=ctx.name,
        namespace=ctx.namespace,
        target=ctx.spec.target.name,
        verdict=(ctx.so_far.verdict.message if ctx.so_far.verdict else None) or "",
        gates=tuple(gates.values()),
        key=key.digest,
        config_hash=config_hash,
        args=ctx.so_far.recommended_args,
    )
    with _forge(ctx) as forge:
        opened = forge.open_or_update_pull_request(
            pr.repository, pr.base_branch, branch, files, title, body
        )
    recorded = ctx.so_far.pull_request
    record = proposing.opened(
        recorded or proposing.intent(ctx.spec, config_hash),
        branch=branch,
        number=opened.number,
        url=opened.url,
        now=iso(ctx.now),
    )
    what = "opened" if opened.created else "updated" if opened.committed else "found"
    said = StatusUpdate.event(
        Reason.PULL_REQUEST_OPEN,
        f"{what} pull request #{opened.number} on {pr.repository} ({opened.url}) from {branch}",
    )
    return said.then(StatusUpdate.of(pull_request=record))


def close_pull_request(ctx: Ctx, step: Step) -> StatusUpdate:
    """Close the recorded pull request and record the state read back; one merged meanwhile
    cannot be closed: say so, loudly. An intent whose number never reached status closes the
    open pull request of the rollout's branch."""
    recorded = ctx.so_far.pull_request
    pr = proposing.open_pull_request(recorded)
    intent = proposing.unconfirmed(recorded) if pr is None else None
    if pr is None and intent is None:
        return NOTHING
    comment = (
        f"kvgate closed this pull request: rollout {ctx.namespace}/{ctx.name} ended "
        f"{step.phase.value} ({step.reason}) before it was merged, so it no longer stands "
        "behind this change. Change the rollout's spec to evaluate and propose again."
    )
    if step.new_run:  # superseded: a newer spec is evaluated now
        comment = (
            f"kvgate closed this pull request: the spec of rollout {ctx.namespace}/{ctx.name} "
            f"changed (generation {ctx.generation}) before it was merged, so this change is no "
            "longer the one it evaluates. A new pull request follows if the new spec passes."
        )
    with _forge(ctx) as forge:  # one token read for the lookup and the close
        if intent is not None:
            pr = _found_again(ctx, forge, intent)
        if pr is None or pr.repository is None or pr.number is None:
            return NOTHING
        seen = forge.close_pull_request(pr.repository, pr.number, redact.scrub_text(comment))
    state = PullRequestState(seen.state)
    if state is PullRequestState.MERGED:
        said = StatusUpdate.event(
            Reason.PULL_REQUEST_MERGED,
            f"pull request #{pr.number} on {pr.repository} was merged before kvgate could close "
            f"it (merge {seen.merge_sha or 'unknown'}): the change reaches the Deployment "
            "through Git; revert it there if it must not",
            warning=True,
        )
    else:
        said = StatusUpdate.event(
            Reason.PULL_REQUEST_CLOSED, f"closed pull request #{pr.number} on {pr.repository}"
        )
    closed = dataclasses.replace(pr, state=state.value, merge_sha=seen.merge_sha or pr.merge_sha)
    return said.then(StatusUpdate.of(pull_request=closed))


def _found_again(ctx: Ctx, forge: RestForge, intent: PullRequestStatus) -> PullRequestStatus | None:
    """The open pull request from the branch of an intent whose number was never recorded."""
    if intent.repository is None or intent.config_hash is None:  # unconfirmed() ruled it out
        return None
    branch = gitops.branch_name(ctx.name, intent.config_hash)
    base = intent.base_branch or _pull_request_spec(ctx).base_branch
    found = forge.find_open_pull_request(intent.repository, base, branch)
    if found is None:
        ctx.logger.info("no open pull request from %s to close", branch)
        return None
    return proposing.opened(intent, branch=branch, number=found.number, url=found.url,
                            now=iso(ctx.now))  # fmt: skip


def observe(ctx: Ctx, phase: Phase, seen: Seen) -> Observation:
    """PullRequestOpen: the recorded pull request's state. PullRequestMerged: is it applied?"""
    recorded = ctx.so_far.pull_request
    if phase is Phase.PULL_REQUEST_OPEN:
        if recorded is None or recorded.number is None or recorded.repository is None:
            return Observation()
        with _forge(ctx) as forge:
            pr = forge.pull_request_state(recorded.repository, recorded.number)
        seen_now = PullRequestSeen(pr.number, pr.url, PullRequestState(pr.state), pr.merge_sha)
        return Observation(pull_request=seen_now)
    gap = apply_gap(ctx, seen)
    return Observation(applied=gap is None, apply_gap=gap or "")


def apply_gap(ctx: Ctx, seen: Seen) -> str | None:
    """What the live Deployment lacks of the tested change: the args/env, the verdict annotation,
    the rollout of that template, its pods on the tested image digest (None: nothing)."""
    name, live = ctx.spec.target.name, seen.live
    if live is None or not live.exists:
        return f"Deployment {name} is gone"
    if not live.container_found:
        return f"Deployment {name} has no container {ctx.so_far.container}"
    if not live.carries_candidate:
        return f"Deployment {name}'s container does not carry the tested args/env yet"
    dep = seen.deployment or {}
    template = (dep.get("spec") or {}).get("template") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    key = verdictkey.recorded(ctx.so_far)
    have = annotations.get(gitops.ANNOTATION_VERDICT)
    if key is not None and have != key.digest:
        return (
            f"the pod template's {gitops.ANNOTATION_VERDICT} annotation is "
            f"{have or 'absent'}, not {key.digest}"
        )
    generation = int((dep.get("metadata") or {}).get("generation") or 0)
    if not kubeobjects.rolled_out(dep, generation):
        return f"Deployment {name} has not finished rolling out generation {generation}"
    running = live_key(ctx)
    if key is not None and key.image_digest and not running.image_digests:
        return "no pod running the tested template reports its image digest yet"
    changed = None if key is None else verdictkey.changes(key, running)
    if changed is not None:
        return f"the pods run another engine, GPU or config than the verdict tested ({changed})"
    return None
