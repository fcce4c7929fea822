"""Reading a typed status's figures for the report without ever raising: a finite number from
anything, an interval, a fraction."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, overload

from kvgate.records.status import RolloutStatus

StatusLike = Mapping[str, Any] | RolloutStatus


def finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):  # an int too large for a float, a word
        return None
    return number if math.isfinite(number) else None


def integer(value: Any) -> int | None:
    number = finite_number(value)
    return int(number) if number is not None else None


def interval(value: Sequence[Any]) -> tuple[float, float] | None:
    """A pair of finite numbers (the typed status keeps intervals as tuples), else None."""
    if len(value) != 2:
        return None
    low, high = finite_number(value[0]), finite_number(value[1])
    return (low, high) if low is not None and high is not None else None


@overload
def as_fraction(value: float) -> float: ...
@overload
def as_fraction(value: float | None) -> float | None: ...
def as_fraction(value: float | None) -> float | None:
    """Accuracy may be a fraction (0.918) or a percentage (91.8); return a fraction."""
    if value is None:
        return None
    return value / 100.0 if value > 1.0 else value
