"""Operator-wide settings, built once at startup from the environment (flags override).

Per-rollout settings live in the KVCacheRollout spec; only what is the same for every rollout
the operator runs is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from kvgate.errors import SpecError

DEFAULT_POLL_INTERVAL_S: Final = 5.0
DEFAULT_EVAL_IMAGE: Final = "ghcr.io/kvgate/kvgate:0.1.0"
DEFAULT_EVAL_CONCURRENCY: Final = 8
DEFAULT_METRICS_PORT: Final = 9090
DEFAULT_MAX_WORKERS: Final = 16
DEFAULT_REPORT_TIMEOUT_S: Final = 10.0
DEFAULT_ERROR_LIMIT: Final = 30  # consecutive outside errors (10 s apart) before giving up


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """What every rollout shares: eval image, data dir, polling, ports."""

    gsm8k_dir: str | None = None  # KVGATE_GSM8K_DIR, passed on to the eval Job
    eval_image: str = DEFAULT_EVAL_IMAGE  # KVGATE_EVAL_IMAGE; spec.canary.evalImage wins
    eval_concurrency: int = DEFAULT_EVAL_CONCURRENCY  # KVGATE_EVAL_CONCURRENCY
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S  # KVGATE_POLL_INTERVAL
    metrics_port: int = DEFAULT_METRICS_PORT  # KVGATE_METRICS_PORT; 0 disables
    max_workers: int = DEFAULT_MAX_WORKERS  # KVGATE_MAX_WORKERS: handler threads
    hub_offline: bool = False  # HF_HUB_OFFLINE: never reach the hub for the scale scan
    scrape_timeout_s: float = DEFAULT_REPORT_TIMEOUT_S  # KVGATE_SCRAPE_TIMEOUT
    error_limit: int = DEFAULT_ERROR_LIMIT  # KVGATE_ERROR_LIMIT

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorConfig:
        """Read the KVGATE_* variables; raises SpecError naming the bad variable."""
        d = cls()
        return cls(
            gsm8k_dir=environ.get("KVGATE_GSM8K_DIR") or None,
            eval_image=environ.get("KVGATE_EVAL_IMAGE") or d.eval_image,
            eval_concurrency=_int(environ, "KVGATE_EVAL_CONCURRENCY", d.eval_concurrency, 1),
            poll_interval_s=_float(environ, "KVGATE_POLL_INTERVAL", d.poll_interval_s, 0.1),
            metrics_port=_int(environ, "KVGATE_METRICS_PORT", d.metrics_port, 0),
            max_workers=_int(environ, "KVGATE_MAX_WORKERS", d.max_workers, 1),
            hub_offline=environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"),
            scrape_timeout_s=_float(environ, "KVGATE_SCRAPE_TIMEOUT", d.scrape_timeout_s, 0.1),
            error_limit=_int(environ, "KVGATE_ERROR_LIMIT", d.error_limit, 1),
        )

    def with_overrides(self, **values: Any) -> OperatorConfig:
        """A copy with the flags that were given (None means not given)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def _int(environ: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SpecError(name, f"{raw!r} is not an integer") from None
    if value < minimum:
        raise SpecError(name, f"{value} is below the minimum {minimum}")
    return value


def _float(environ: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SpecError(name, f"{raw!r} is not a number") from None
    if value < minimum:
        raise SpecError(name, f"{value:g} is below the minimum {minimum:g}")
    return value
