"""The eval Job's resources: the operator's bounds, which a rollout may lower, never raise or drop.

`spec.canary.resources` is the rollout author's, and the eval Job runs in production's
namespace: a zero quantity reads as unset to Kubernetes (BestEffort, unbounded), and an
extended resource (`nvidia.com/gpu`) would make the judge hold GPUs. So a rollout may name only
`cpu` and `memory` under `requests` and `limits`, each a positive quantity no larger than the
operator's limit for it (the chart's `evalResources`), and a request no larger than its limit.
Raising a bound is the operator's admin's call, in the chart. The load Job's bounds
(`loadResources`) take nothing from the rollout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from kvgate.errors import InputError

FIELD: Final = "spec.canary.resources"
PARTS: Final = ("requests", "limits")
RESOURCES: Final = ("cpu", "memory")
_SUFFIX: Final = {
    "": Decimal(1), "m": Decimal("0.001"),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
QUANTITY: Final = re.compile(r"(\d+(?:\.\d+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


def quantity(value: object) -> Decimal | None:
    """A Kubernetes quantity's value (`500m` -> 0.5, `2Gi` -> 2147483648), None if not one."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    match = QUANTITY.fullmatch(str(value).strip())
    if match is None:
        return None
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
    except InvalidOperation:
        return None


def eval_resources(
    operator: Mapping[str, Any], rollout: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """The eval container's resources: the operator's, with the values the rollout lowers.

    Raises InputError naming the field and the bound for anything else: another key or
    resource, a value that is not a positive quantity, a value above the operator's limit, or
    a request above the resulting limit.
    """
    extra = sorted(str(k) for k in rollout if k not in PARTS)
    if extra:
        raise InputError(f"{FIELD}: only requests and limits, not {', '.join(extra)}")
    merged: dict[str, dict[str, Any]] = {p: dict(operator.get(p) or {}) for p in PARTS}
    ceiling = {str(k): quantity(v) for k, v in (operator.get("limits") or {}).items()}
    for part in PARTS:
        amounts = rollout.get(part) or {}
        if not isinstance(amounts, Mapping):
            raise InputError(f"{FIELD}.{part}: an object of cpu and memory quantities")
        for name, raw in amounts.items():
            where = f"{FIELD}.{part}.{name}"
            if name not in RESOURCES:
                raise InputError(
                    f"{where}: the eval Job takes only cpu and memory from a rollout "
                    f"(its bounds are the chart's evalResources)"
                )
            value = quantity(raw)
            if value is None or value <= 0:
                raise InputError(
                    f"{where}: {str(raw)[:40]!r} is not a positive quantity (500m, 2Gi); "
                    "a zero would remove the bound"
                )
            bound = ceiling.get(str(name))
            if bound is not None and value > bound:
                raise InputError(
                    f"{where}: {raw} is above the operator's limit "
                    f"{operator['limits'][name]} (chart value evalResources.limits.{name}); "
                    "a rollout may lower the eval Job's bounds, only the chart may raise them"
                )
            merged[part][str(name)] = raw
    for name, raw in merged["requests"].items():
        limit = merged["limits"].get(name)
        if limit is not None and (quantity(raw) or 0) > (quantity(limit) or 0):
            raise InputError(
                f"{FIELD}: requests.{name} {raw} is above limits.{name} {limit}; "
                "lower the request or leave it to the chart"
            )
    return {part: values for part, values in merged.items() if values}
