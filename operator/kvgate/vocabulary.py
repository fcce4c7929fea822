"""What words does kvgate speak? The KVCacheRollout's names, phases, outcomes and modes.

The spec (what the user asked for) is `kvgate.spec.rollout`; `Condition` is a status
piece (the rest of status is `kvgate.records.status`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from kvgate.errors import UnsupportedError
from kvgate.reasons import Reason

GROUP: Final = "kvgate.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "kvcacherollouts"


LABEL_ROLLOUT: Final = "kvgate.io/rollout"
LABEL_ARM: Final = "kvgate.io/arm"
LABEL_ATTEMPT: Final = "kvgate.io/attempt"
ANNOTATION_APPROVE: Final = "kvgate.io/approve"
# Recorded by the chart's MutatingAdmissionPolicy from the request's identity, and guarded by
# its ValidatingAdmissionPolicy (charts/kvgate/templates/approvalpolicy.yaml).
ANNOTATION_CREATED_BY: Final = "kvgate.io/created-by"
ANNOTATION_APPROVED_BY: Final = "kvgate.io/approved-by"
ANNOTATION_APPROVED_GENERATION: Final = "kvgate.io/approved-generation"
ANNOTATION_ABORT: Final = "kvgate.io/abort"
ANNOTATION_ABORTED_BY: Final = "kvgate.io/aborted-by"
ANNOTATION_CONFIG_HASH: Final = "kvgate.io/config-hash"
# The eval NetworkPolicy's own spec hash: an owned policy with another hash is replaced.
ANNOTATION_POLICY_HASH: Final = "kvgate.io/policy-hash"
# `status.preflight.source` when the pool samples came from Prometheus (absent: the pods'
# /metrics), and `status.speed.clocks.source`.
PROMETHEUS_SOURCE: Final = "prometheus"
# A Job's nonce, which its summary line carries back (the operator reads only its own Job's).
EVAL_NONCE_ENV: Final = "KVGATE_EVAL_NONCE"
LOAD_NONCE_ENV: Final = "KVGATE_LOAD_NONCE"


# The eval summary's reason for an accuracy look whose control scored below the margin: no loss
# of the margin can be measured there (kvgate.evaluation.gate), so it is inconclusive.
CONTROL_BELOW_FLOOR: Final = "control_below_floor"


class Phase(StrEnum):
    """Where a rollout is; the terminal ones never change again."""

    PENDING = "Pending"
    PREFLIGHT = "Preflight"
    CANARY = "Canary"
    EVALUATING = "Evaluating"
    MEASURING = "Measuring"  # the load Job on both arms (spec.gates.capacityGain.throughputGain)
    AWAITING_APPROVAL = "AwaitingApproval"
    PROMOTING = "Promoting"
    VERIFYING = "Verifying"
    REVERTING = "Reverting"  # kvgate's change is being taken out; sticky until read back
    # pullRequest mode: the tested change is proposed on the GitOps repository (waiting for a
    # merge), then merged (waiting for the GitOps tool to apply it); kvgate never patches.
    PULL_REQUEST_OPEN = "PullRequestOpen"
    PULL_REQUEST_MERGED = "PullRequestMerged"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"
    NOT_NEEDED = "NotNeeded"
    FAILED = "Failed"
    DECLINED = "Declined"  # pullRequest mode: the pull request was closed without a merge

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL: Final = frozenset(
    {Phase.PROMOTED, Phase.ROLLED_BACK, Phase.NOT_NEEDED, Phase.FAILED, Phase.DECLINED}
)
# Report mode's end: the verdict is written, nothing more will happen (the phase stays
# AwaitingApproval so GitOps health checks read a passing verdict as healthy).
VERDICT_REPORTED: Final = Reason.VERDICT_REPORTED


def ended(phase: Phase, reason: str | None) -> bool:
    """A terminal phase, or report mode's end; the one place this rule is written."""
    return phase.terminal or (phase is Phase.AWAITING_APPROVAL and reason == VERDICT_REPORTED)


# Phases during which the production Deployment carries (or may carry) the candidate config.
PATCHED_PHASES: Final = frozenset({Phase.PROMOTING, Phase.VERIFYING, Phase.REVERTING})


class Outcome(StrEnum):
    """One gate's result. `worst()` orders them; the worst decides."""

    SKIPPED = "Skipped"  # gate is off
    SUCCESSFUL = "Successful"
    WARNING = "Warning"  # passes, but someone should read the message
    PENDING = "Pending"  # evidence not there yet
    NOT_NEEDED = "NotNeeded"  # the change buys nothing
    INCONCLUSIVE = "Inconclusive"  # evidence too weak: fail closed
    ERROR = "Error"  # evidence could not be obtained: fail closed
    FAILED = "Failed"  # evidence says no

    @property
    def blocks(self) -> bool:
        """True when this outcome forbids promotion."""
        return self in (Outcome.INCONCLUSIVE, Outcome.ERROR, Outcome.FAILED)


_OUTCOME_ORDER: Final = list(Outcome)


def worst(outcomes: Iterable[Outcome]) -> Outcome:
    """The worst of `outcomes` (SKIPPED when there are none)."""
    return max(outcomes, key=_OUTCOME_ORDER.index, default=Outcome.SKIPPED)


class GateMode(StrEnum):
    REQUIRE = "require"
    WARN = "warn"
    OFF = "off"


class PromotionMode(StrEnum):
    AUTO = "auto"
    MANUAL = "manual"
    REPORT = "report"
    # Report mode that fails closed: the rollout itself is the gate a GitOps sync waits on
    # (a passing verdict is Ready; any other end is Stalled, Degraded in Argo CD).
    GATE = "gate"
    # kvgate proposes the tested change as a pull request on the GitOps repository and waits
    # until the GitOps tool has applied it; it never patches the Deployment itself.
    PULL_REQUEST = "pullRequest"

    @property
    def changes_deployment(self) -> bool:
        """Whether kvgate patches the Deployment (auto, manual) or not (report, gate,
        pullRequest)."""
        return self in (PromotionMode.AUTO, PromotionMode.MANUAL)


class PullRequestState(StrEnum):
    """A pull (merge) request as the forge reports it."""

    OPEN = "open"
    MERGED = "merged"
    CLOSED = "closed"  # closed without merging: declined


class ForgeProvider(StrEnum):
    """The Git forge a `pullRequest` promotion talks to (its REST API)."""

    GITEA = "gitea"
    GITHUB = "github"
    GITLAB = "gitlab"


class GitFileKind(StrEnum):
    """The one file kvgate owns in the GitOps repository."""

    KUSTOMIZE_PATCH = "kustomizePatch"  # a strategic-merge patch naming the container
    HELM_VALUES = "helmValues"  # a values file: the change under `valuesKey`


class Remediation(StrEnum):
    AUTO = "auto"  # a known crash signature gets one more candidate with the version's remedy
    OFF = "off"


class Engine(StrEnum):
    AUTO = "auto"  # the spec's default: the engine is read from the Deployment
    VLLM = "vllm"
    SGLANG = "sglang"


# The engines themselves (every Engine but AUTO), as plain names.
ENGINE_NAMES: Final = tuple(e.value for e in Engine if e is not Engine.AUTO)


def check_engine(engine: str | None) -> str | None:
    """A caller's engine name: None for auto (detect it), else the known name in lower case."""
    if engine is None or engine == "auto":
        return None
    if engine.lower() not in ENGINE_NAMES:
        raise UnsupportedError(f"engine '{engine}' is not known; use vllm, sglang or auto")
    return engine.lower()


KV_DTYPES: Final = ("fp8", "fp8_e4m3", "fp8_e5m2")

# The spellings of a 16-bit KV cache: `auto` on a BF16 or FP16 model, and the dtypes themselves.
_SIXTEEN_BIT: Final = frozenset({"auto", "bf16", "bfloat16", "float16", "fp16", "half"})


def kv_dtype_family(dtype: str) -> str:
    """What a KV dtype name stores, however a flag, a log, /metrics or torch spells it: `auto`,
    bf16 and fp16 are all 16-bit; `fp8_e5m2` is e5m2; vLLM's `fp8` and every other FP8 cache
    (`fp8_e4m3`, `float8_e4m3fn`, `fp8_inc`) is e4m3 on CUDA. The one dtype normaliser."""
    name = dtype.strip("'\"").lower().removeprefix("torch.")
    if name in _SIXTEEN_BIT:
        return "16-bit"
    if name.startswith(("fp8_e5m2", "float8_e5m2")):
        return "fp8_e5m2"
    if name.startswith(("fp8", "float8_e4m3")):
        return "fp8_e4m3"
    return name


@dataclass(frozen=True, slots=True)
class Condition:
    """A `metav1.Condition`: type, status True/False/Unknown, CamelCase reason, message."""

    type: str
    status: str
    reason: str
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str | None = None


def config_hash(parts: Mapping[str, Any]) -> str:
    """A short stable hash of the evaluated configuration (what an approval binds to)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
