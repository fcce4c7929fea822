"""May this candidate take another rollout's verdict instead of running its own eval and load?

Only when the spec asks for it (`spec.reuseVerdict`), and only a verdict that holds for exactly
what this candidate runs: a rollout in the same namespace that ended `Promoted` (its verdict
passed and production verified it), whose recorded verdict key equals this candidate's key
field by field (the image digest the candidate runs, the engine and its version, the model and
revision, the KV dtype, the attention backend the engine chose, the GPU product and count, the
tested args and env, the gates' settings), which is not `Stale`, and which ended at most
`maxAge` ago. A key with any of those fields unknown never reuses: an unknown GPU or backend is
not the same GPU or backend. Pure: the controller lists the rollouts and passes them in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any, Final

from kvgate.flow.steps import ReusedVerdict
from kvgate.judge.gates import ACCURACY, DIVERGENCE, LONG_CONTEXT, SPEED, THROUGHPUT
from kvgate.judge.verdict import Decision
from kvgate.judge.verdictkey import key_of
from kvgate.records.status import RolloutStatus, VerdictKey
from kvgate.records.timestamps import parse_time
from kvgate.spec.rollout import RolloutSpec, VerdictReuse
from kvgate.vocabulary import Outcome, Phase

# The gates the eval and the load decide: what a reused verdict stands in for. The canary's
# own gates (dtype, engine truth, scales, backend, capacity) are judged on this candidate.
REUSED_GATES: Final = (ACCURACY, LONG_CONTEXT, DIVERGENCE, SPEED, THROUGHPUT)
# Every field of the key must be known but `image` (the tag; its digest is `image_digest`),
# `gpu_count` (None where the container asks for no GPU count) and `revision` (None where the
# spec pins none); those must still be equal on both sides.
REQUIRED: Final = tuple(
    f.name for f in fields(VerdictKey) if f.name not in ("image", "gpu_count", "revision")
)


def unknown_fields(key: VerdictKey) -> tuple[str, ...]:
    """The key's fields that must be known to reuse and are not."""
    return tuple(name for name in REQUIRED if getattr(key, name) in (None, ""))


def reusable(
    status: RolloutStatus,
    spec: RolloutSpec,
    list_rollouts: Callable[[], Iterable[Mapping[str, Any]]],
    *,
    namespace: str,
    name: str,
    now: dt.datetime,
) -> ReusedVerdict | None:
    """The verdict of another rollout this candidate may take (`find`): the namespace's
    rollouts are listed only when the spec asks for reuse and the candidate's key is known."""
    if spec.reuse_verdict is None:
        return None
    key = key_of(status, spec)
    if unknown_fields(key):
        return None
    return find(key, spec.reuse_verdict, list_rollouts(), namespace=namespace, name=name, now=now)


def find(
    key: VerdictKey,
    reuse: VerdictReuse | None,
    rollouts: Iterable[Mapping[str, Any]],
    *,
    namespace: str,
    name: str,
    now: dt.datetime,
) -> ReusedVerdict | None:
    """The freshest verdict this candidate may take, or None (then it runs its own eval)."""
    if reuse is None or unknown_fields(key):
        return None
    best: ReusedVerdict | None = None
    for obj in rollouts:
        found = _reusable(key, reuse, obj, namespace=namespace, name=name, now=now)
        if found is not None and (best is None or found.age_s < best.age_s):
            best = found
    return best


def _reusable(
    key: VerdictKey,
    reuse: VerdictReuse,
    obj: Mapping[str, Any],
    *,
    namespace: str,
    name: str,
    now: dt.datetime,
) -> ReusedVerdict | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    other = meta.get("name")
    if not isinstance(other, str) or other == name or meta.get("deletionTimestamp"):
        return None
    status = RolloutStatus.from_dict(obj.get("status"))
    verdict = status.verdict
    if status.phase is not Phase.PROMOTED or verdict is None or verdict.key is None:
        return None
    if verdict.decision != Decision.PROMOTE.value or verdict.reused_from:
        return None  # only a verdict reached by an eval, never one reused in turn
    # The stored digest is not trusted (it is computed again on reading): field by field.
    if verdict.key != key:
        return None
    if any(c.type == "Stale" and c.status == "True" for c in status.conditions):
        return None
    finished = parse_time(status.finished_at)
    if finished is None:
        return None
    age_s = (now - finished).total_seconds()
    if not 0 <= age_s <= reuse.max_age_s:
        return None
    gates = [r for g in REUSED_GATES if (r := status.gates.get(g)) is not None]
    if any(r.outcome not in (Outcome.SUCCESSFUL, Outcome.SKIPPED, Outcome.WARNING) for r in gates):
        return None  # a Promoted rollout has none; a status that says so is not reused
    if not any(g.gate == ACCURACY and g.outcome is Outcome.SUCCESSFUL for g in gates):
        return None  # the eval's own verdict is what is reused: it must be there
    return ReusedVerdict(
        source=f"{namespace}/{other}",
        finished_at=status.finished_at or "",
        age_s=round(age_s, 3),
        key_digest=key.digest,
        gates=tuple(gates),
    )
