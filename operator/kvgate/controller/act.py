"""Acting on a `Step`: creating canaries and the eval Job, the promotion patch and the revert.

Deletions are write-ahead (made on the reconcile after the one that recorded them); the patch and
the revert only run in phases whose status write already recorded the decision. Each action
returns what status keeps of what it did (a `StatusUpdate`); it writes no status itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import secrets
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from kvgate.adapters import hub
from kvgate.change import container as promotion
from kvgate.change import manifests
from kvgate.controller.candidate import (
    candidate_record,
    derive_candidate,
    derive_candidate_unchecked,
    fingerprint_container,
    shown_env,
)
from kvgate.controller.changes import NOTHING, StatusUpdate
from kvgate.controller.context import Ctx, describe
from kvgate.controller.ownership import adopt_child, owned
from kvgate.controller.pullrequest import close_pull_request, open_pull_request
from kvgate.controller.seen import (
    arm_ips,
    evaluated_live,
    leftover_child,
    live_container,
    own_pods,
    target_deployment,
)
from kvgate.controller.sources import arm_tpot_totals, canary_port, hub_token_problem
from kvgate.controller.telemetry import REVERT_FAILURES
from kvgate.errors import ExternalError, InputError, KubeError, KvgateError
from kvgate.flow.deadlines import latest_start_s, load_timeout_s
from kvgate.flow.steps import Action, Step
from kvgate.judge import throughput
from kvgate.reasons import Reason
from kvgate.records.codec import record_of
from kvgate.records.status import (
    ArmStatus,
    EvalStatus,
    FirstAttempt,
    LoadStatus,
    PromotionStatus,
    RemediationStatus,
    RevertStatus,
    RolloutStatus,
    SpeedStatus,
)
from kvgate.records.timestamps import iso, parse_time
from kvgate.spec.rollout import RolloutSpec, is_local_path
from kvgate.vocabulary import (
    ANNOTATION_POLICY_HASH,
    EVAL_NONCE_ENV,
    LABEL_ARM,
    LOAD_NONCE_ENV,
    Phase,
    config_hash,
)

# Deletions are write-ahead: recorded with the step that decides them, made on the next
# reconcile. A crash in between re-runs them (they are idempotent); done at once, a crash
# after deleting a canary and before the status write would read as "canary disappeared".
DEFERRED: Final = (Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB)


def acts(ctx: Ctx, step: Step, before: StatusUpdate = NOTHING) -> Iterator[StatusUpdate]:
    """The step's actions in order, each seeing what `before` and the ones before it did; yields
    the fold after each, so a caller keeps what the actions before a failing one did."""
    done = before
    for action in step.actions:
        seen = ctx.seeing(done)
        if action in DEFERRED:
            pending = set(seen.so_far.pending_actions)
            update = StatusUpdate.of(pending_actions=tuple(sorted(pending | {action.value})))
        else:
            update = ACTIONS[action](seen, step)
        done = done.then(update)
        yield done


def act_best_effort(ctx: Ctx, step: Step, before: StatusUpdate = NOTHING) -> StatusUpdate:
    """Giving up after errors: try every action (as `acts`); owner references clean up what
    fails."""
    done = before
    try:
        for fold in acts(ctx, step, before):  # what the actions did, kept up to a failing one
            done = fold
    except (ExternalError, KvgateError) as exc:
        ctx.logger.warning("acting failed while giving up: %s", exc)
    return done


def run_pending(ctx: Ctx, step: Step) -> StatusUpdate:
    """The deletions an earlier reconcile recorded; cleared once they all went through."""
    known = {a.value for a in Action}
    pending = [Action(a) for a in ctx.so_far.pending_actions if a in known]
    for action in pending:
        ACTIONS[action](ctx, step)
    return StatusUpdate.of(pending_actions=()) if pending else NOTHING


def create_canaries(ctx: Ctx, step: Step) -> StatusUpdate:
    dep = target_deployment(ctx)
    if dep is None:
        raise KvgateError(f"Deployment {ctx.spec.target.name} disappeared")
    template = (dep.get("spec") or {}).get("template") or {}
    index, container = manifests.find_container(template.get("spec") or {}, ctx.so_far.container)
    # Both arms come from the live container and the spec (status only holds fingerprints).
    candidate = derive_candidate(ctx, container)
    arms = {"control": container, "candidate": candidate}
    created = []
    for arm, c in arms.items():
        pod = manifests.build_canary_pod(
            rollout=ctx.name,
            namespace=ctx.namespace,
            arm=arm,
            template=template,
            container_index=index,
            container=c,
            config_hash=str(ctx.so_far.config_hash),
        )
        if ensure_fresh(ctx, pod, arm)[1]:
            ctx.reads.rollout_pods = None
            created.append(pod["metadata"]["name"])
    if created:
        return StatusUpdate.event(Reason.CANARY_CREATED, f"created {', '.join(created)}")
    return NOTHING


def ensure_fresh(ctx: Ctx, obj: dict[str, Any], role: str) -> tuple[dict[str, Any], bool]:
    """`ensure_child` of `obj`, adopted; one of an earlier run is deleted and waited for."""
    adopt_child(ctx, obj, role)
    existing, made = ensure_child(ctx, obj)
    if not made and leftover_child(ctx, existing):
        delete_owned(ctx, obj["kind"], existing)
        shown = "pod" if obj["kind"] == "Pod" else obj["kind"]  # as the phase messages say it
        raise KubeError(f"{shown} {obj['metadata']['name']} of an earlier run is still terminating")
    return existing, made


def ensure_child(ctx: Ctx, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create `obj`, or find the one of its name, and whether this made it; one this rollout
    does not own is never touched."""
    existing, made = ctx.kube.ensure(obj)
    if not made and not owned(ctx, existing):
        kind, name = obj["kind"], obj["metadata"]["name"]
        raise KvgateError(
            f"{kind} {name} exists and is not this rollout's; kvgate does not touch it: "
            f"rename the rollout or remove that {kind}"
        )
    return existing, made


def delete_owned(ctx: Ctx, kind: str, obj: Mapping[str, Any]) -> None:
    """Delete `obj` if this rollout owns it, and only that object (uid precondition)."""
    if owned(ctx, obj):
        meta = obj["metadata"]
        ctx.kube.delete(kind, ctx.namespace, meta["name"], uid=meta.get("uid"))
        listed = (ctx.reads.rollout_pods or {}).get(meta["name"]) if kind == "Pod" else None
        if listed is not None:  # as a new LIST would show it: terminating (saves that LIST)
            listed["metadata"]["deletionTimestamp"] = iso(ctx.now)


def delete_canaries(ctx: Ctx, step: Step) -> StatusUpdate:
    pods = own_pods(ctx)
    for arm in manifests.ARMS:
        pod = pods.get(manifests.canary_name(ctx.name, arm))
        if pod is not None:
            delete_owned(ctx, "Pod", pod)
    return NOTHING


def create_eval_job(ctx: Ctx, step: Step) -> StatusUpdate:
    status = ctx.so_far
    attempt = step.eval_attempts or (status.eval.attempt if status.eval else None) or 1
    ips, port = arm_addresses(ctx)
    secret_env = eval_secret_env(ctx.spec, status.model)
    # checked in Pending too; the label may have gone since (fail closed)
    if secret_env and (problem := hub_token_problem(ctx.kube, ctx.config, ctx.namespace, ctx.spec)):
        raise InputError(problem)
    # Before the Job: its pod never runs unconfined (where the CNI enforces NetworkPolicy).
    # The hub is reached for a hub tokenizer, and for GSM8K itself when no local copy is set.
    hub = hub_tokenizer(ctx.spec, status.model) is not None or not ctx.config.gsm8k_dir
    ensure_eval_policy(ctx, port=port, hub=hub)
    job = manifests.build_eval_job(
        rollout=ctx.name,
        namespace=ctx.namespace,
        attempt=attempt,
        image=ctx.config.eval_image,  # the judge is the operator's, never the rollout's
        command=manifests.eval_command(
            ctx.spec,
            control_url=f"http://{ips['control']}:{port}/v1/completions",
            candidate_url=f"http://{ips['candidate']}:{port}/v1/completions",
            model=status.served_model or status.model,
            concurrency=manifests.eval_concurrency(ctx.spec, ctx.config.eval_concurrency),
            max_model_len=engine_max_model_len(status),
            tokenizer=status.model,
        ),
        env=job_env(ctx),
        resources=manifests.eval_resources(ctx.config.eval_resources, ctx.spec.canary.resources),
        deadline_s=ctx.spec.canary.eval_timeout_s,
        config_hash=str(status.config_hash),
        service_account_name=ctx.config.eval_service_account,
        nonce=secrets.token_hex(16),
        writable_tmp=ctx.config.eval_writable_tmp,
        secret_env=secret_env,
    )
    # Fail closed: the Job names no Secret but the token that passed hub_token_problem.
    allowed = {ref[0] for ref in secret_env.values()}
    if not manifests.secret_names(job) <= allowed:
        raise KvgateError("the eval Job would reference a Secret that was not checked")
    existing, started = ensure_job(ctx, job, "eval", Reason.EVAL_STARTED, attempt)
    # The nonce of the Job that runs (a restarted operator finds its predecessor's); only its
    # hash is kept in status, which rollout readers can see.
    ev = dataclasses.replace(
        status.eval or EvalStatus(),
        attempt=attempt,
        job=job["metadata"]["name"],
        nonce_sha256=nonce_hash(existing),
        progress={},
    )
    return started.then(StatusUpdate.of(eval=ev))


def arm_addresses(ctx: Ctx) -> tuple[dict[str, str | None], int]:
    ips = arm_ips(ctx)
    if not all(ips.values()):
        raise KvgateError("a canary pod has no IP")  # bug-level: the core checked readiness
    return ips, canary_port(ctx.so_far)


def ensure_job(
    ctx: Ctx, job: dict[str, Any], role: str, started: Reason, attempt: int
) -> tuple[dict[str, Any], StatusUpdate]:
    """This attempt's Job, created once: the one that runs, and the Event of its start."""
    existing, made = ensure_fresh(ctx, job, role)
    if not made:
        return existing, NOTHING
    name = job["metadata"]["name"]
    event = StatusUpdate.event(started, f"{role} attempt {attempt}: Job {name}")
    # A Job made late (the operator was away once its attempt was recorded) keeps its own
    # attempt's bound: the phase clock moves so that much is left, never back.
    phase = Phase.MEASURING if role == "load" else Phase.EVALUATING
    since = parse_time(ctx.so_far.phase_since) or ctx.now
    latest = ctx.now - dt.timedelta(seconds=latest_start_s(ctx.spec, phase))
    if latest <= since:
        return existing, event
    return existing, event.then(StatusUpdate.of(phase_since=iso(latest)))


def create_load_job(ctx: Ctx, step: Step) -> StatusUpdate:
    """`kvgate load-job` on both canaries at production's load."""
    status = ctx.so_far
    load = status.load or LoadStatus()
    attempt = step.load_attempts or load.attempt or 1
    ips, port = arm_addresses(ctx)
    gate = ctx.spec.capacity_gain.throughput_gain
    concurrency = throughput.production_concurrency(status.preflight)
    deadline_s = load_timeout_s(ctx.spec)
    lengths = throughput.production_lengths(status.preflight)
    job = manifests.build_load_job(
        rollout=ctx.name,
        namespace=ctx.namespace,
        attempt=attempt,
        image=ctx.config.load_job_image,  # the operator's, never the rollout's
        command=manifests.load_command(
            control_url=f"http://{ips['control']}:{port}",
            candidate_url=f"http://{ips['candidate']}:{port}",
            model=status.served_model or status.model or "",
            production_concurrency=concurrency,
            prompt_tokens=lengths.prompt_tokens,
            output_tokens=lengths.output_tokens,
            max_concurrency=max(gate.max_concurrency if gate else concurrency, concurrency),
            server_type="sglang" if status.engine == "sglang" else "vllm",
            deadline_s=deadline_s,
            slo_ttft_ms=gate.ttft_p99_ms if gate else None,
            slo_tpot_ms=gate.tpot_p99_ms if gate else None,
            # the served model's source: the clients count with its tokenizer where the Job can
            # read it, else with the word tokenizer, and the engines' counters check either
            tokenizer=status.model,
        ),
        deadline_s=deadline_s,
        config_hash=str(status.config_hash),
        # the word tokenizer (counts as kvgate.sim does) is built from GSM8K's train split
        env=job_env(ctx),
        resources=ctx.config.load_resources,  # the operator's; a rollout does not change them
        service_account_name=ctx.config.eval_service_account,
        nonce=secrets.token_hex(16),
    )
    # Before the Job, as for the eval: its pods reach only the canaries' port and DNS.
    ensure_eval_policy(ctx, port=port, hub=False, role="load")
    existing, started = ensure_job(ctx, job, "load", Reason.LOAD_STARTED, attempt)
    # As for the eval: the nonce of the Job that runs, hashed; and the load it was asked for.
    load = dataclasses.replace(
        load,
        attempt=attempt,
        job=job["metadata"]["name"],
        nonce_sha256=nonce_hash(existing, LOAD_NONCE_ENV),
        concurrency=job_concurrency(existing) or concurrency,
        lengths=lengths.message,
        # the window of the arms' GPU clocks under this load: from its Job's creation
        started_at=job_created_at(existing) or round(ctx.now.timestamp(), 3),
        clocks=None,  # another attempt's clocks say nothing of this one's
    )
    return started.then(StatusUpdate.of(load=load))


def job_env(ctx: Ctx) -> dict[str, str]:
    gsm8k = {"KVGATE_GSM8K_DIR": ctx.config.gsm8k_dir} if ctx.config.gsm8k_dir else {}
    return {"PYTHONUNBUFFERED": "1", **gsm8k}


def job_created_at(job: Mapping[str, Any]) -> float | None:
    stamp = (job.get("metadata") or {}).get("creationTimestamp")
    created = parse_time(stamp if isinstance(stamp, str) else None)
    return round(created.timestamp(), 3) if created is not None else None


def job_concurrency(job: Mapping[str, Any]) -> int | None:
    """The --production-concurrency the Job runs with (a restarted operator finds its
    predecessor's Job, made perhaps from other preflight figures)."""
    container = job_container(job)
    args = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    if "--production-concurrency" in args:
        i = args.index("--production-concurrency")
        if i + 1 < len(args) and args[i + 1].isdigit():
            return int(args[i + 1])
    return None


def ensure_eval_policy(ctx: Ctx, *, port: int, hub: bool, role: str = "eval") -> None:
    """The Job's NetworkPolicy; an owned one with another spec (an earlier run's port or hub
    rule) is deleted and made again on the next reconcile."""
    policy = manifests.build_eval_network_policy(
        rollout=ctx.name, namespace=ctx.namespace, canary_port=port, hub=hub, role=role
    )
    adopt_child(ctx, policy, role)
    name = policy["metadata"]["name"]
    existing, made = ensure_child(ctx, policy)
    if not made and policy_hash(existing) != policy_hash(policy):
        delete_owned(ctx, "NetworkPolicy", existing)
        raise KubeError(f"NetworkPolicy {name} of an earlier run is being replaced")


def policy_hash(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_POLICY_HASH)


def hub_tokenizer(spec: RolloutSpec, model: str | None) -> str | None:
    """The hub repo the long-context task loads its tokenizer from (None: none, or a path)."""
    lc = spec.accuracy.long_context
    name = (lc.tokenizer if lc else None) or model
    if lc is None or not name or is_local_path(str(name)) or not hub.looks_like_repo_id(name):
        return None
    return str(name)


def eval_secret_env(spec: RolloutSpec, model: str | None) -> dict[str, tuple[str, str]]:
    """HF_TOKEN from spec.model.tokenSecretRef when the long-context task loads a hub tokenizer."""
    secret = spec.model.token_secret
    if secret is None or hub_tokenizer(spec, model) is None:
        return {}
    return {"HF_TOKEN": (secret.name, secret.key)}


def engine_max_model_len(status: RolloutStatus) -> int | None:
    """The control's max model length as its startup log states it (the production value)."""
    control = status.arms.get("control")
    scan = control.scan if control is not None else None
    length = scan.capacity.max_model_len if scan is not None and scan.capacity else None
    return length if length is not None and length > 0 else None


def job_container(job: Mapping[str, Any]) -> Mapping[str, Any]:
    """A kvgate Job's one container ({} when the object has none)."""
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    container: Mapping[str, Any] = (pod_spec.get("containers") or [{}])[0]
    return container


def nonce_hash(job: Mapping[str, Any], env_name: str = EVAL_NONCE_ENV) -> str | None:
    for env in job_container(job).get("env") or []:
        if env.get("name") == env_name and env.get("value"):
            return hashlib.sha256(str(env["value"]).encode()).hexdigest()
    return None


def delete_eval_jobs(ctx: Ctx, step: Step) -> StatusUpdate:
    """The eval and load Jobs of every attempt, and their NetworkPolicies."""
    jobs: dict[str, str] = {}  # name -> role
    for pod in own_pods(ctx).values():  # one LIST of the rollout's pods serves both roles
        labels = pod["metadata"].get("labels") or {}
        job, role = labels.get("job-name"), labels.get(LABEL_ARM)
        if job and role in ("eval", "load"):
            jobs[job] = role
    status = ctx.so_far
    attempts = (status.eval.attempt if status.eval else None) or 0
    jobs.update((manifests.eval_job_name(ctx.name, a), "eval") for a in range(1, attempts + 1))
    loads = (status.load.attempt if status.load else None) or 0
    jobs.update(
        (manifests.load_job_name(ctx.name, a), "load") for a in range(1, min(loads, 99) + 1)
    )
    for name in sorted(jobs):
        job = ctx.kube.read_job(ctx.namespace, name)
        if job is not None:
            delete_owned(ctx, "Job", job)
    # A role's NetworkPolicy and Job are made only after status recorded the attempt (the step
    # before records it: write-ahead), so the roles status names are all there can be; a
    # rollout that never recorded one is not read for them (two GETs fewer per rollout).
    for role in sorted(set(jobs.values())):
        policy = ctx.kube.read_network_policy(
            ctx.namespace, manifests.eval_policy_name(ctx.name, role)
        )
        if policy is not None:
            delete_owned(ctx, "NetworkPolicy", policy)
    return NOTHING


def snapshot_speed(ctx: Ctx, step: Step) -> StatusUpdate:
    """Speed: TPOT histogram totals of both arms before the eval, which is the fixed load."""
    if ctx.spec.speed is None:
        return NOTHING
    speed = dataclasses.replace(
        ctx.so_far.speed or SpeedStatus(),
        before=arm_tpot_totals(ctx.so_far, arm_ips(ctx), ctx.config.scrape_timeout_s),
        started_at=round(ctx.now.timestamp(), 3),  # the window of the arms' GPU clocks
    )
    return StatusUpdate.of(speed=speed)


def apply_promotion_patch(ctx: Ctx, step: Step) -> StatusUpdate:
    """Apply the candidate once (the decision is in status: Promoting), as a test-and-set the
    apiserver refuses if the container changed since this read."""
    index, live = evaluated_live(ctx)
    wanted = manifests.container_config(derive_candidate(ctx, live))
    ops = promotion.patch_ops(index, live, wanted)
    if not ops:
        raise KvgateError("the candidate equals the evaluated container: nothing to promote")
    dep = ctx.kube.patch_deployment(ctx.namespace, ctx.spec.target.name, ops)
    generation = dep["metadata"].get("generation")
    promo = dataclasses.replace(
        ctx.so_far.promotion or PromotionStatus(),
        patched=True,
        patched_at=iso(ctx.now),
        generation=generation if isinstance(generation, int) else None,
    )
    patched = StatusUpdate.event(
        Reason.PROMOTING,
        f"patched Deployment {ctx.spec.target.name} (generation {generation}): "
        f"{' '.join(ctx.so_far.recommended_args)}",
    )
    # The rollout's startup time runs from the patch: one made late (the operator was away
    # since Promoting was recorded) is not timed from the decision.
    return patched.then(StatusUpdate.of(promotion=promo, phase_since=iso(ctx.now)))


def revert_target(ctx: Ctx, step: Step) -> StatusUpdate:
    """Take kvgate's edits out of the live container (three-way), as a test-and-set. A refused
    patch is recorded, not raised: the next reconcile reads the Deployment back and confirms the
    revert or reports RevertFailed and tries again after a back-off."""
    found = live_container(ctx, target_deployment(ctx))
    if found is None:
        return NOTHING  # the observation says why; nothing to patch
    index, live = found
    previous, candidate = ctx.so_far.previous, ctx.so_far.candidate
    target = promotion.revert(live, previous, candidate, view=fingerprint_container(ctx, live))
    ops = promotion.patch_ops(index, live, target)
    if not ops:
        return NOTHING
    revert = ctx.so_far.revert or RevertStatus()
    error = None
    try:
        ctx.kube.patch_deployment(ctx.namespace, ctx.spec.target.name, ops)
    except ExternalError as exc:
        REVERT_FAILURES.labels(ctx.namespace, ctx.name).inc()
        error = describe(exc)
        ctx.logger.warning("revert of %s refused: %s", ctx.spec.target.name, error)
    revert = dataclasses.replace(
        revert,
        attempts=(revert.attempts or 0) + 1,
        last_attempt_at=iso(ctx.now),
        last_error=error,
    )
    return StatusUpdate.of(revert=revert)


def remediate(ctx: Ctx, step: Step) -> StatusUpdate:
    """Record the step's remedy and the remedied candidate in status; no cluster write. The
    canaries are deleted (deferred) and created again, remedied, after this status write; a new
    config hash makes the crashed pods leftovers never read as this attempt's."""
    remedy = step.remedy
    if remedy is None:
        raise KvgateError("a Remediate action without a remedy")
    _, live = evaluated_live(ctx)
    derive_candidate(ctx, live)  # the live container and the candidate are still the evaluated
    first = ctx.so_far.arms.get("candidate") or ArmStatus()
    findings = first.scan.findings if first.scan is not None else ()
    decided = StatusUpdate.of(remediation=record_of(
        RemediationStatus,
        remedy,
        engine_version=remedy.version,
        env=dict(remedy.env),
        attempt=1,
        decided_at=iso(ctx.now),
        first_attempt=FirstAttempt(
            message=step.message[:500],
            attention_backend=first.attention_backend,
            findings=tuple(f.code for f in findings if f.code is not None),
        ),
    ))  # fmt: skip
    candidate = derive_candidate_unchecked(ctx.seeing(decided), live)
    record = candidate_record(ctx.spec, candidate, shown_env(ctx), remedy.env)
    return decided.then(record).then(StatusUpdate.of(
        config_hash=config_hash(
            {"evaluated": ctx.so_far.config_hash, "remediation": remedy.to_dict()}
        ),
        arms={},  # the first attempt's arms are gone
        capacity=None,
        phase_since=iso(ctx.now),  # the remedied candidate gets its own startup time
    ))  # fmt: skip


ACTIONS: Final[dict[Action, Callable[[Ctx, Step], StatusUpdate]]] = {
    Action.CREATE_CANARIES: create_canaries,
    Action.DELETE_CANARIES: delete_canaries,
    Action.CREATE_EVAL_JOB: create_eval_job,
    Action.DELETE_EVAL_JOB: delete_eval_jobs,
    Action.CREATE_LOAD_JOB: create_load_job,
    Action.SNAPSHOT_SPEED: snapshot_speed,
    Action.PATCH_DEPLOYMENT: apply_promotion_patch,
    Action.OPEN_PULL_REQUEST: open_pull_request,
    Action.CLOSE_PULL_REQUEST: close_pull_request,
    Action.REVERT_DEPLOYMENT: revert_target,
    Action.REMEDIATE: remediate,
}
