"""How is one mapping of a spec read? `SpecReader` reads typed fields and collects a `SpecError`
for each bad one (naming its path) instead of raising at the first; `parse_duration` reads the
durations the spec and the operator's settings use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final, TypeVar

from kvgate.errors import SpecError, brief

_DURATION_RE: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


# Kubernetes names (API conventions): an object's is a DNS-1123 subdomain, a namespace's (and a
# container's) a DNS-1123 label. Checked whole (`fullmatch`: `$` would let a trailing newline by).
DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_subdomain(text: str) -> bool:
    return len(text) <= 253 and DNS_SUBDOMAIN.fullmatch(text) is not None


def is_label(text: str) -> bool:
    return len(text) <= 63 and DNS_LABEL.fullmatch(text) is not None


def parse_duration(text: str) -> float:
    """`"1h30m"`, `"90s"`, `"250ms"` -> seconds; raises ValueError on anything else."""
    pos, total = 0, 0.0
    for match in _DURATION_RE.finditer(text if isinstance(text, str) else ""):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not isinstance(text, str) or not text or pos != len(text):
        raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 5m or 1h30m")
    return total


_E = TypeVar("_E", bound=StrEnum)
_T = TypeVar("_T")


class SpecReader:
    """Reads one mapping of a spec, collecting SpecErrors instead of raising at the first."""

    def __init__(
        self, data: Any, path: str, errors: list[SpecError] | None = None, present: bool = True
    ) -> None:
        self.path = path
        self.errors: list[SpecError] = [] if errors is None else errors
        self.present = present
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.error("", f"{data!r} is not an object")
            data = {}
        self.data: Mapping[str, Any] = data

    def _field(self, key: str) -> str:
        return f"{self.path}.{key}" if key else self.path

    def error(self, key: str, message: str) -> None:
        self.errors.append(SpecError(self._field(key), message))

    def raw(self, key: str) -> Any:
        return self.data.get(key)

    def raise_errors(self) -> None:
        if self.errors:
            raise ExceptionGroup(f"{len(self.errors)} invalid field(s) in {self.path}", self.errors)

    def optional(self, key: str, read: Callable[..., _T], *args: Any, **kwargs: Any) -> _T | None:
        """`read(key, ...)` of a field whose absence means None, not a default."""
        return None if self.data.get(key) is None else read(key, *args, **kwargs)

    def section(self, key: str, *, required: bool = False) -> SpecReader:
        value = self.data.get(key)
        if value is None and required:
            self.error(key, "is required")
        return SpecReader(value, self._field(key), self.errors, present=value is not None)

    def string(self, key: str, *, required: bool = False) -> str | None:
        value = self.data.get(key)
        if value is None or value == "":
            if required:
                self.error(key, "is required")
            return None
        if not isinstance(value, str):
            self.error(key, f"{value!r} is not a string")
            return None
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(key, f"{value!r} is not an object")
            return {}
        return dict(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self.error(key, f"{value!r} is not true or false")
            return default
        return value

    def choice(self, key: str, enum: type[_E], default: _E) -> _E:
        value = self.data.get(key, default.value)
        try:
            return enum(value)
        except ValueError:
            allowed = ", ".join(m.value for m in enum)
            self.error(key, f"{value!r} is not one of {allowed}")
            return default

    def one_of(self, key: str, allowed: Sequence[str], default: str) -> str:
        value = self.data.get(key, default)
        if value not in allowed:
            self.error(key, f"{value!r} is not one of {', '.join(allowed)}")
            return default
        return str(value)

    def integer(self, key: str, default: int, minimum: int, maximum: int) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(key, f"{value!r} is not an integer; use a value in [{minimum}, {maximum}]")
            return default
        if not minimum <= value <= maximum:
            self.error(key, f"{value} is outside [{minimum}, {maximum}]; use a value in that range")
            return default
        return value

    def number(
        self,
        key: str,
        default: float,
        minimum: float,
        maximum: float,
        *,
        exclusive_min: bool = False,
    ) -> float:
        value = self.data.get(key, default)
        low = "(" if exclusive_min else "["
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(
                key, f"{value!r} is not a number; use a value in {low}{minimum:g}, {maximum:g}]"
            )
            return default
        too_low = value <= minimum if exclusive_min else value < minimum
        if too_low or value > maximum:
            self.error(
                key,
                f"{value:g} is outside {low}{minimum:g}, {maximum:g}]; use a value in that range",
            )
            return default
        return float(value)

    def duration(self, key: str, default: float, *, minimum: float) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.error(key, str(exc))
            return default
        if seconds < minimum:
            self.error(key, f"{value} is shorter than {minimum:g}s; use a longer duration")
            return default
        return seconds

    def list_of(
        self, key: str, kind: type[_T], what: str, *, at_most: int | None = None, why: str = ""
    ) -> list[_T]:
        """A list of `kind`. Hostile input is one error, never a message the size of the input:
        the value is shown cut (`errors.brief`), a list longer than `at_most` is refused by its
        length, and only the first entry that is not `kind` is named."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.error(key, f"{brief(value)} is not a list{why}")
            return []
        if at_most is not None and len(value) > at_most:
            self.error(f"{key}[{at_most}]", f"{len(value):,} entries: at most {at_most}{why}")
            return []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, kind):
                self.error(f"{key}[{i}]", f"{brief(item)} is not {what}")
                return []
        return list(value)
