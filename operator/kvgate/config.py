"""Operator-wide settings, built once at startup from the environment (flags override).

Per-rollout settings live in the KVCacheRollout spec; only what is the same for every rollout
the operator runs is here.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeVar

from kvgate.errors import SpecError
from kvgate.spec import allowed as policy
from kvgate.spec.jobresources import QUANTITY
from kvgate.spec.reader import is_subdomain, parse_duration

DEFAULT_POLL_INTERVAL_S: Final = 5.0
# The eval Job's bounds when the chart sets none (the chart's evalResources defaults agree).
DEFAULT_EVAL_RESOURCES: Final[Mapping[str, Mapping[str, str]]] = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}
# The load Job's bounds when the chart sets none (the chart's loadResources defaults agree):
# two inference-perf runs (a main process and `num_workers` workers each, every one with
# transformers and pyarrow loaded), measured at about 400 MiB a process.
DEFAULT_LOAD_RESOURCES: Final[Mapping[str, Mapping[str, str]]] = {
    "requests": {"cpu": "1", "memory": "1Gi"},
    "limits": {"cpu": "4", "memory": "4Gi"},
}
DEFAULT_EVAL_IMAGE: Final = "ghcr.io/kvgate/kvgate:0.1.0"
DEFAULT_METRICS_PORT: Final = 9090


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """What every rollout shares: eval image, data dir, polling, ports, what rollouts may set."""

    gsm8k_dir: str | None = None  # KVGATE_GSM8K_DIR, passed on to the eval Job
    # KVGATE_EVAL_IMAGE: the judge's image; a rollout cannot choose it (spec.canary.evalImage
    # is refused). A digest reference (repo@sha256:...) pins it.
    eval_image: str = DEFAULT_EVAL_IMAGE
    # KVGATE_LOAD_IMAGE: the load Job's image (inference-perf needs Python 3.12+, so it is its
    # own image); None: the eval image. Like the eval image, a rollout cannot choose it.
    load_image: str | None = None
    # KVGATE_EVAL_SERVICE_ACCOUNT: the eval Job's ServiceAccount (the chart creates one with
    # no RBAC and no token mounted); None: the namespace's default.
    eval_service_account: str | None = None
    # KVGATE_EVAL_WRITABLE_TMP: an emptyDir at /tmp in the eval Job (its root filesystem is
    # read-only). Off only where pods share the host filesystem (the project's test kubelet).
    eval_writable_tmp: bool = True
    # KVGATE_EVAL_RESOURCES (JSON {"requests": {...}, "limits": {...}}, the chart's
    # evalResources): the eval container's bounds; a rollout's spec.canary.resources may
    # lower a value, never raise or drop one (jobresources). "{}": none (BestEffort).
    eval_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: DEFAULT_EVAL_RESOURCES
    )
    # KVGATE_LOAD_RESOURCES (the same JSON, the chart's loadResources): the load Job's
    # bounds; rollouts do not change them. "{}": none.
    load_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: DEFAULT_LOAD_RESOURCES
    )
    # KVGATE_MODEL_DIRS (os.pathsep-separated): the only places a local spec.model.name may be
    model_dirs: tuple[str, ...] = ()
    # KVGATE_EXTRA_ALLOWED_ARGS / KVGATE_EXTRA_ALLOWED_ENV (comma lists; env entries may end
    # in `*` for a prefix): what rollouts may set beyond kvgate.spec.allowed's built-in lists. The
    # denylist the CRD enforces cannot be extended.
    allowlist: policy.Allowlist = policy.BUILTIN
    eval_concurrency: int = 8  # KVGATE_EVAL_CONCURRENCY
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S  # KVGATE_POLL_INTERVAL
    metrics_port: int = DEFAULT_METRICS_PORT  # KVGATE_METRICS_PORT; 0 disables
    max_workers: int = 16  # KVGATE_MAX_WORKERS: handler threads
    hub_offline: bool = False  # offline_requested: never reach the hub for the scale scan
    scrape_timeout_s: float = 10.0  # KVGATE_SCRAPE_TIMEOUT
    # KVGATE_ERROR_LIMIT: consecutive outside errors (10 s apart) before giving up
    error_limit: int = 30
    # KVGATE_APPROVAL_IDENTITY: an approval counts only with the approver, author and
    # generation the chart's admission policy records (the chart sets it with the policy).
    approval_identity: bool = False
    # KVGATE_APPROVAL_TTL (a duration, e.g. 72h): how long after the verdict an approval may
    # come; past it the rollout ends ApprovalExpired. "0" or "never": no limit.
    approval_ttl_s: float | None = 72 * 3600.0
    # KVGATE_PROMETHEUS_URL (http(s)://host:port of the Prometheus HTTP API): preflight reads
    # production's pool history there with PromQL instead of scraping the pods; None: scrape.
    prometheus_url: str | None = None
    # KVGATE_HUB_TOKEN_SECRETS (the chart's hubTokenSecrets.enabled): spec.model.tokenSecretRef
    # is honoured only when set, and then only for a Secret labelled kvgate.io/hub-token="true";
    # off, a rollout naming one fails (InvalidSpec) before anything is created.
    hub_token_secrets: bool = False
    # KVGATE_FORGE_TOKEN_SECRETS: spec.promotion.pullRequest.tokenSecretRef is honoured only
    # when set, and then only for a Secret labelled kvgate.io/forge-token="true"; off, a
    # pullRequest rollout fails (InvalidSpec) before anything is created.
    forge_token_secrets: bool = False

    @property
    def load_job_image(self) -> str:
        """The image the load Job runs: KVGATE_LOAD_IMAGE, else the eval image."""
        return self.load_image or self.eval_image

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorConfig:
        """Read the KVGATE_* variables; raises SpecError naming the bad variable."""
        d = cls()
        return cls(
            gsm8k_dir=environ.get("KVGATE_GSM8K_DIR") or None,
            eval_image=_image(environ, "KVGATE_EVAL_IMAGE", d.eval_image),
            load_image=_image(environ, "KVGATE_LOAD_IMAGE", "") or None,
            eval_service_account=_name(environ, "KVGATE_EVAL_SERVICE_ACCOUNT"),
            eval_writable_tmp=_bool(environ, "KVGATE_EVAL_WRITABLE_TMP", d.eval_writable_tmp),
            eval_resources=_resources(environ, "KVGATE_EVAL_RESOURCES", d.eval_resources),
            load_resources=_resources(environ, "KVGATE_LOAD_RESOURCES", d.load_resources),
            model_dirs=tuple(
                p for p in (environ.get("KVGATE_MODEL_DIRS") or "").split(os.pathsep) if p
            ),
            allowlist=_allowlist(environ),
            eval_concurrency=_number(
                environ, "KVGATE_EVAL_CONCURRENCY", int, d.eval_concurrency, 1
            ),
            poll_interval_s=_number(environ, "KVGATE_POLL_INTERVAL", float, d.poll_interval_s, 0.1),
            metrics_port=_number(environ, "KVGATE_METRICS_PORT", int, d.metrics_port, 0),
            max_workers=_number(environ, "KVGATE_MAX_WORKERS", int, d.max_workers, 1),
            hub_offline=offline_requested(environ),
            scrape_timeout_s=_number(
                environ, "KVGATE_SCRAPE_TIMEOUT", float, d.scrape_timeout_s, 0.1
            ),
            error_limit=_number(environ, "KVGATE_ERROR_LIMIT", int, d.error_limit, 1),
            approval_identity=_bool(environ, "KVGATE_APPROVAL_IDENTITY", d.approval_identity),
            approval_ttl_s=_ttl(environ, "KVGATE_APPROVAL_TTL", d.approval_ttl_s),
            prometheus_url=_url(environ, "KVGATE_PROMETHEUS_URL"),
            hub_token_secrets=_bool(environ, "KVGATE_HUB_TOKEN_SECRETS", d.hub_token_secrets),
            forge_token_secrets=_bool(environ, "KVGATE_FORGE_TOKEN_SECRETS", d.forge_token_secrets),
        )

    def with_overrides(self, **values: Any) -> OperatorConfig:
        """A copy with the flags that were given (None means not given)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})


_N = TypeVar("_N", int, float)


def _number(environ: Mapping[str, str], name: str, kind: type[_N], default: _N, minimum: _N) -> _N:
    """An int or a finite float, as `kind` says (nan would pass every minimum)."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    spec = "d" if kind is int else "g"
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise SpecError(name, f"{raw!r} is not {what}") from None
    if not math.isfinite(value):
        raise SpecError(name, f"{raw!r} is not a finite number")
    if value < minimum:
        raise SpecError(name, f"{value:{spec}} is below the minimum {minimum:{spec}}")
    return value


_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")
_IMAGE: Final = re.compile(r"[^\s@]+(@sha256:[0-9a-f]{64})?")


_URL: Final = re.compile(r"https?://[^\s/?#@]+(/[^\s?#]*)?")


def _url(environ: Mapping[str, str], name: str) -> str | None:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return None
    if "@" in raw:  # never echo what may be a password
        raise SpecError(name, "credentials in the URL are not accepted; use a plain http(s) URL")
    if len(raw) > 2048 or not _URL.fullmatch(raw):
        shown = raw[:80] + ("..." if len(raw) > 80 else "")
        raise SpecError(name, f"{shown!r} is not an http(s) URL such as http://prometheus:9090")
    return raw.rstrip("/")


def _ttl(environ: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = (environ.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("0", "never"):
        return None
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise SpecError(name, str(exc)) from None


def _bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (environ.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SpecError(name, f"{raw!r} is not a boolean; use true or false")


def _name(environ: Mapping[str, str], name: str) -> str | None:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return None
    if not is_subdomain(raw):
        raise SpecError(name, f"{raw!r} is not a Kubernetes object name")
    return raw


def _image(environ: Mapping[str, str], name: str, default: str) -> str:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    if not _IMAGE.fullmatch(raw):
        raise SpecError(name, f"{raw!r} is not an image reference (repo:tag or repo@sha256:...)")
    return raw


def _resources(
    environ: Mapping[str, str], name: str, default: Mapping[str, Mapping[str, str]]
) -> Mapping[str, Mapping[str, str]]:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except ValueError:
        raise SpecError(name, 'not JSON; use {"requests": {...}, "limits": {...}}') from None
    if not isinstance(value, dict) or set(value) - {"requests", "limits"}:
        raise SpecError(name, "an object with only requests and limits")
    out: dict[str, dict[str, str]] = {}
    for part, amounts in value.items():
        if not isinstance(amounts, dict):
            raise SpecError(f"{name}.{part}", "an object of resource name to quantity")
        for resource, amount in amounts.items():
            text = str(amount) if isinstance(amount, int | float | str) else ""
            if isinstance(amount, bool) or not QUANTITY.fullmatch(text):
                raise SpecError(
                    f"{name}.{part}.{resource}", f"{text[:40]!r} is not a quantity (500m, 2Gi)"
                )
            out.setdefault(part, {})[str(resource)] = text
    return out


def _allowlist(environ: Mapping[str, str]) -> policy.Allowlist:
    read: dict[str, policy.Allowlist] = {}
    for kind, name in (("args", "KVGATE_EXTRA_ALLOWED_ARGS"), ("env", "KVGATE_EXTRA_ALLOWED_ENV")):
        items = [x.strip() for x in (environ.get(name) or "").split(",") if x.strip()]
        try:
            read[kind] = policy.Allowlist.from_config(**{kind: items})
        except ValueError as exc:
            raise SpecError(name, str(exc)) from None
    return policy.Allowlist(extra_args=read["args"].extra_args, extra_env=read["env"].extra_env)


# ---- the Hugging Face environment (the eval Job's dataset, preflight's checkpoints) ------------

HF_OFFLINE_VARIABLES: Final = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline_requested(environ: Mapping[str, str]) -> bool:
    """HF_HUB_OFFLINE (or HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE) is set to a true value."""
    return any(
        environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for v in HF_OFFLINE_VARIABLES
    )


def hf_hub_cache(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache directory, by huggingface_hub's own precedence of variables.

    Read from `environ` at the call, not from huggingface_hub.constants, fixed at its import.
    """
    explicit = environ.get("HF_HUB_CACHE") or environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = environ.get("HF_HOME")
    if not home:
        xdg = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        home = str(Path(xdg) / "huggingface")
    return Path(home).expanduser() / "hub"
