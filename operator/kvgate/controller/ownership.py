"""Which objects are this rollout's? Its children carry its owner reference and kvgate's labels
only; kvgate touches an object only when this very rollout (by uid) owns it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from kvgate.change import manifests
from kvgate.controller.context import Ctx


def adopt_child(ctx: Ctx, obj: dict[str, Any], arm: str) -> None:
    kopf.adopt(obj, owner=ctx.rollout.owner())
    # adopt() copies the rollout's labels onto the child; a label like app=<model> would let a
    # production Service route traffic to a canary, so children keep kvgate's labels only.
    obj["metadata"]["labels"] = {
        **manifests.child_labels(ctx.name, arm),
        **{
            k: v
            for k, v in (obj["metadata"].get("labels") or {}).items()
            if k.startswith("kvgate.io/")
        },
    }


def owned(ctx: Ctx, obj: Mapping[str, Any]) -> bool:
    """Whether this rollout (this very object, by uid) owns `obj`."""
    uid = ctx.rollout.uid
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(r.get("uid") == uid for r in refs)
