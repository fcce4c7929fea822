"""Reading a status's fields for the report without ever raising: the first present spelling of
a key, a finite number from anything, an interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, overload

from kvgate.records.status import RolloutStatus

StatusLike = Mapping[str, Any] | RolloutStatus


def first_of(mapping: Any, *keys: str) -> Any:
    """The first present key of `keys` in `mapping` (camelCase first, then snake_case)."""
    if not isinstance(mapping, Mapping):
        return None
    for key in keys:
        if key in mapping and mapping[key] is not None:
            return mapping[key]
    return None


def finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            return None
        return number if math.isfinite(number) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def integer(value: Any) -> int | None:
    number = finite_number(value)
    return int(number) if number is not None else None


def interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, Mapping):
        value = [first_of(value, "low", "lower"), first_of(value, "high", "upper")]
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        low, high = finite_number(value[0]), finite_number(value[1])
        if low is not None and high is not None:
            return (low, high)
    return None


@overload
def as_fraction(value: float) -> float: ...
@overload
def as_fraction(value: float | None) -> float | None: ...
def as_fraction(value: float | None) -> float | None:
    """Accuracy may be a fraction (0.918) or a percentage (91.8); return a fraction."""
    if value is None:
        return None
    return value / 100.0 if value > 1.0 else value
