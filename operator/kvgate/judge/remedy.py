"""Is there a known fix for this crash, and may kvgate apply it?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.records.status import ScanRecord


@dataclass(frozen=True, slots=True)
class Remedy:
    """The documented remedy for a candidate's crash signature, valid for its engine version;
    `refused` says why the operator's allowlist does not let kvgate apply it (empty: allowed)."""

    code: str  # the finding it answers: attention-build-failed or fp8-unsupported
    engine: str
    version: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    refused: str = ""

    @property
    def text(self) -> str:
        parts = [" ".join(self.args)] if self.args else []
        parts.extend(f"{k}={v}" for k, v in self.env.items())
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "engine": self.engine,
            "engineVersion": self.version,
            "args": list(self.args),
            "env": dict(self.env),
        }


def find_remedy(
    scan: ScanRecord | None,
    engine: str | None,
    image_version: str | None,
    allowlist: Any = None,
) -> Remedy | None:
    """The remedy for the first remediable error finding of a crashed candidate's scan.

    The version is the one the engine logged, else the image tag's; without either there is
    none (the flag or variable that picks a backend depends on the version).
    """
    from kvgate.engines import versions as engine_versions
    from kvgate.spec import allowed as policy

    if scan is None or not engine:
        return None
    version = scan.engine_version or image_version
    codes = [f.code for f in scan.findings if (f.severity or "").lower() == "error"]
    code = next((c for c in codes if c in engine_versions.REMEDIABLE_CODES), None)
    if code is None or not isinstance(version, str):
        return None
    try:
        found = engine_versions.remedy_for(engine, version, code)
    except ValueError:
        return None
    if found is None:
        return None
    args, env = found
    allow = allowlist if allowlist is not None else policy.BUILTIN
    refused = [v.message for v in policy.check_args(list(args), engine, allow)]
    refused += [f"{n} is not an allowed variable" for n in env if not allow.env_allowed(engine, n)]
    return Remedy(code, engine, version, tuple(args), dict(env), "; ".join(refused))
