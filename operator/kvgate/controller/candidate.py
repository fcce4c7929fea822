"""What is the candidate container, and is the live one still the evaluated one?

Status holds fingerprints only (literal env values and secret-looking flag values hashed), so
the candidate is derived again from the spec and the live container whenever a pod or the
Deployment is written, and checked against what Pending recorded; anything else fails closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate import redact
from kvgate.change import container as promotion
from kvgate.change import manifests
from kvgate.controller.changes import StatusUpdate
from kvgate.controller.context import Ctx
from kvgate.errors import KvgateError
from kvgate.records.status import EnvVar, RemediationStatus
from kvgate.spec.rollout import RolloutSpec


def evaluated_container(ctx: Ctx) -> dict[str, Any]:
    """The production container as evaluated: image plus the command/args/env in status."""
    out = dict(ctx.so_far.previous)
    if ctx.so_far.evaluated_image is not None:
        out["image"] = ctx.so_far.evaluated_image
    return out


def shown_env(ctx: Ctx) -> frozenset[str]:
    """Env names status may show the values of: the engine's allowlist and the extraEnv (the
    only variables kvgate changes, so the only ones a revert must restore)."""
    engine = ctx.so_far.engine
    return ctx.config.allowlist.env_for(engine) | {e.name for e in ctx.spec.extra_env}


def candidate_record(
    spec: RolloutSpec,
    candidate: Mapping[str, Any],
    show_env: frozenset[str],
    remedy_env: Mapping[str, str] | None = None,
) -> StatusUpdate:
    """The candidate as status records it: its fingerprinted config, and the args and env an
    SRE would set by hand (env: the rollout's extraEnv, a remedy's on top)."""
    env = {e.name: e.value for e in spec.extra_env} | dict(remedy_env or {})
    return StatusUpdate.of(
        candidate=redact.redact_config(manifests.container_config(candidate), show_env=show_env),
        recommended_args=tuple(
            redact.redact_args(
                list(candidate.get("command") or []) + list(candidate.get("args") or [])
            )
        ),
        recommended_env=tuple(EnvVar(name=k, value=v) for k, v in env.items()),
    )


def fingerprint_container(ctx: Ctx, container: Mapping[str, Any]) -> dict[str, Any]:
    """A container as status records it: literal env values and secret-looking flag values
    fingerprinted (token for token, so positions in args are kept), image as it is."""
    view = redact.redact_config(manifests.container_config(container), show_env=shown_env(ctx))
    if "image" in container:
        view["image"] = container["image"]
    return view


def against(ctx: Ctx, container: Mapping[str, Any]) -> promotion.Comparison:
    """`container` against the evaluated container and status.previous -> status.candidate."""
    status = ctx.so_far
    view = fingerprint_container(ctx, container)
    return promotion.compare(view, evaluated_container(ctx), status.previous, status.candidate)


def derive_candidate(ctx: Ctx, live: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate container, derived again from the spec and the live container; fail
    closed: the live container must still be the evaluated one and the candidate the one
    recorded in Pending, so a changed target or an edited status never reaches a pod."""
    if against(ctx, live).differences:
        raise KvgateError("the Deployment changed since it was evaluated; not acting on it")
    candidate = manifests.candidate_container(ctx.spec, live, remedy=recorded_remedy(ctx))
    recorded = ctx.so_far.candidate
    if (
        not recorded
        or fingerprint_container(ctx, manifests.container_config(candidate)) != recorded
    ):
        raise KvgateError("the candidate derived now differs from the one evaluated in Pending")
    return candidate


def derive_candidate_unchecked(ctx: Ctx, live: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate with status.remediation applied, before status records its fingerprint
    (only `act.remediate` calls this, right after `derive_candidate` checked the unremedied)."""
    return manifests.candidate_container(ctx.spec, live, remedy=recorded_remedy(ctx))


def recorded_remedy(ctx: Ctx) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """The remedy status.remediation names, from the engine table (never the args or env status
    shows); a record no row answers raises."""
    from kvgate.engines import versions as engine_versions

    record = ctx.so_far.remediation
    if record is None or record == RemediationStatus():
        return None
    engine, version, code = (str(v) for v in (record.engine, record.engine_version, record.code))
    try:
        remedy = engine_versions.remedy_for(engine, version, code)
    except ValueError:
        remedy = None
    if remedy is None:
        raise KvgateError(f"status.remediation names no known remedy ({engine} {version} {code})")
    return remedy
