"""The rollout status as one typed record: what kvgate has found and done.

`RolloutStatus.from_dict` is total: any JSON value (or anything else) reads without raising; a field
of the wrong type reads as unknown (None or empty), never as a guess. It also reads the older
spellings a release wrote, and only those (`oldspellings`, each with the release that removes it). `to_dict` writes camelCase only, leaves nulls and
empty collections out, and stores each figure once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from kvgate.reasons import Reason
from kvgate.records.codec import fields as _fields
from kvgate.records.codec import key as _key
from kvgate.records.codec import read_record
from kvgate.records.codec import write as _write
from kvgate.records.evalsummary import AccuracyStatus, JsonValue
from kvgate.records.loadresult import LoadSummary
from kvgate.records.oldspellings import COPIES
from kvgate.vocabulary import VERDICT_REPORTED, Condition, Outcome, Phase, config_hash, ended

# Why the open fields are open (their descriptions in the CRD's schema, `records.schema`).
_CONTAINER: Final = (
    "Open: the container's command, args and env as Kubernetes holds them (env entries whole, "
    "valueFrom included), literal values fingerprinted; the revert compares them verbatim."
)

# --- the parts -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindingRecord:
    """One startup-log finding as status keeps it (text cut to 300 characters, scrubbed)."""

    code: str | None = None
    severity: str | None = None
    line: int | None = None
    text: str | None = None
    hint: str | None = None
    count: int | None = None


@dataclass(frozen=True, slots=True)
class CapacityRecord:
    """The KV pool as the engine's startup log reported it."""

    kv_tokens: int | None = None
    max_concurrency: float | None = None
    kv_memory_gib: float | None = _key("kvMemoryGiB")
    max_model_len: int | None = None
    num_gpu_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class ScanRecord:
    """A startup-log scan (`logs.LogScan`), cut down for status."""

    engine: str | None = None
    engine_version: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    attention_backend_candidates: tuple[str, ...] = _key(default=())
    capacity: CapacityRecord | None = None
    ready: bool | None = None
    failed: bool | None = None
    findings: tuple[FindingRecord, ...] = _key(default=())
    lines: int | None = None
    tail: tuple[str, ...] = _key(default=())  # a crashed arm's last log lines

    @property
    def kv_tokens(self) -> int | None:
        tokens = self.capacity.kv_tokens if self.capacity is not None else None
        return tokens if tokens is not None and tokens > 0 else None


@dataclass(frozen=True, slots=True)
class CacheTruth:
    """What the arm's own /metrics (and SGLang's /server_info) say about its KV cache."""

    engine: str | None = None
    cache_config: Mapping[str, str] = _key(default={})  # the engine's cache_config_info labels
    max_total_tokens: int | None = None
    server_info: Mapping[str, JsonValue] = _key(
        default={},
        doc="Open: SGLang's /server_info answer, verbatim (the engine's own format, which "
        "changes between its versions).",
    )


@dataclass(frozen=True, slots=True)
class ArmStatus:
    """One canary arm: its Pod, startup-log scan and /metrics truth."""

    pod: str | None = None
    ip: str | None = None
    image_id: str | None = _key("imageID")  # the image the arm ran, by digest
    node: str | None = None  # the node the arm's pod ran on
    gpu_product: str | None = None  # the node's nvidia.com/gpu.product label (None: unknown)
    gpu_count: int | None = None  # the container's nvidia.com/gpu limit (or request)
    scan: ScanRecord | None = None
    metrics: CacheTruth | None = None
    metrics_error: str | None = None

    @property
    def kv_tokens(self) -> int | None:
        return self.scan.kv_tokens if self.scan is not None else None

    @property
    def attention_backend(self) -> str | None:
        return self.scan.attention_backend if self.scan is not None else None


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """What the preflight found in the checkpoint's config (KV scales, forced FP8 KV)."""

    finding: str | None = None
    present: bool | None = None
    commit: str | None = None
    coverage: str | None = None
    source: str | None = None
    expected_capacity_gain: float | None = None
    forces_fp8_kv: tuple[str, ...] = _key(default=())
    kv_bytes_per_token: Mapping[str, int] = _key(default={})
    # k/v scales that cannot scale ("layer 1: k_scale 0.0"; kvgate.checkpoint.scales, ScalesBroken)
    broken_scales: tuple[str, ...] = _key(default=())
    effective_control_format: str | None = None  # what `auto` runs on this checkpoint
    # spec.kvCache.skipLayers against this model's layers: why an entry names none (InvalidSpec)
    skip_layers_problem: str | None = None
    # The model facts vLLM's FP8 study advises on (kvgate.checkpoint.advice)
    head_dim: int | None = None
    kv_layers: int | None = None
    sliding_window_layers: int | None = None


@dataclass(frozen=True, slots=True)
class GuidanceRecord:
    """One note of the engine's own guidance that applies to this rollout (kvgate.checkpoint.advice):
    advice to weigh, never a gate."""

    code: str | None = None
    message: str | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class PoolSample:
    """One /metrics pool sample of one production pod."""

    engine: str | None = None
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    retracted: float | None = None  # SGLang's requests retracted (its preemption), a gauge
    preemptions: float | None = None
    ttft_sum: float | None = None
    ttft_count: float | None = None
    # Totals of production's request-length histograms (tokens), since the engine started.
    prompt_len_sum: float | None = None
    prompt_len_count: float | None = None
    output_len_sum: float | None = None
    output_len_count: float | None = None


@dataclass(frozen=True, slots=True)
class PressureRecord:
    """Is the KV pool the limit, for one replica (or the deciding one)."""

    pressured: bool | None = None
    samples: int | None = None
    pressured_samples: int | None = None
    fraction: float | None = None
    min_fraction: float | None = None
    usage_threshold: float | None = None
    mean_usage: float | None = None
    max_usage: float | None = None
    mean_waiting: float | None = None
    preemptions: float | None = None
    reasons: tuple[str, ...] = _key(default=())


@dataclass(frozen=True, slots=True)
class PreflightStatus:
    checkpoint: CheckpointRecord | None = None
    # vLLM's FP8-study cautions for this model and spec, written once with the checkpoint scan
    advice: tuple[GuidanceRecord, ...] = _key(default=())
    checkpoint_has_scales: bool | None = None
    samples: Mapping[str, tuple[PoolSample, ...]] = _key(default={})
    ticks: int | None = None
    last_sample_at: str | None = None
    source: str | None = None  # model.PROMETHEUS_SOURCE, or None: the pods' /metrics
    errors: tuple[str, ...] = _key(default=())
    pressure: PressureRecord | None = None
    pressure_by_pod: Mapping[str, PressureRecord] = _key(default={})


@dataclass(frozen=True, slots=True)
class EvalProgress:
    """Where the eval Job's sequential test stands after its latest look (its progress line)."""

    look: int | None = None  # 1-based
    looks_planned: int | None = None
    questions: int | None = None  # paired questions answered so far
    difference: float | None = None  # candidate minus control accuracy so far, a fraction


@dataclass(frozen=True, slots=True)
class EvalStatus:
    attempt: int | None = None
    job: str | None = None
    nonce_sha256: str | None = None
    progress: Mapping[str, JsonValue] = _key(
        default={},
        doc="Open: the eval Job's last progress line as the Job printed it (read as look, "
        "looksPlanned, questions, difference).",
    )

    @property
    def look_progress(self) -> EvalProgress | None:
        """`progress` read as an `EvalProgress`; None before the first look."""
        return read_eval_progress(self.progress)


def read_eval_progress(line: object) -> EvalProgress | None:
    """The eval Job's progress line as an `EvalProgress`; None without a look's figures."""
    read: EvalProgress = read_record(EvalProgress, line)
    return None if read.look is None or read.questions is None else read


@dataclass(frozen=True, slots=True)
class HistogramTotals:
    """An arm's TPOT histogram totals at one end of the speed window, or why they are missing."""

    sum: float | None = None
    count: float | None = None
    error: str | None = None  # the arm's /metrics could not be read


class ClockReading(NamedTuple):
    """One clock of one arm over the speed window, in MHz."""

    mean: float
    low: float
    high: float


# No GPU clock is near 100 GHz: a larger figure is junk (a unit slip, a counter, a hostile edit).
MAX_MHZ: Final = 100_000.0


def _reading(mean: object, span: tuple[object, ...]) -> ClockReading | None:
    numbers = [mean, *span]
    plausible = [
        float(n)
        for n in numbers
        if isinstance(n, int | float) and not isinstance(n, bool) and 0 < n < MAX_MHZ
    ]
    if len(numbers) != 3 or len(plausible) != 3:
        return None  # absent, or an edited status: unknown, never a guess
    m, low, high = plausible
    return ClockReading(m, low, high) if low <= high else None


@dataclass(frozen=True, slots=True)
class ClockRecord:
    """An arm's GPU clocks over the speed window as DCGM reported them: the SM and the memory
    clock's mean and (lowest, highest), rounded to 0.1 MHz."""

    sm_mhz: float | None = _key("smMHz")
    sm_range_mhz: tuple[float, ...] = _key("smRangeMHz", default=())
    mem_mhz: float | None = _key("memMHz")
    mem_range_mhz: tuple[float, ...] = _key("memRangeMHz", default=())

    @classmethod
    def of(cls, sm: ClockReading | None = None, mem: ClockReading | None = None) -> ClockRecord:
        def kept(r: ClockReading | None) -> tuple[float | None, tuple[float, ...]]:
            return (
                (None, ()) if r is None else (round(r.mean, 1), (round(r.low, 1), round(r.high, 1)))
            )

        (sm_mhz, sm_range), (mem_mhz, mem_range) = kept(sm), kept(mem)
        return cls(sm_mhz, sm_range, mem_mhz, mem_range)

    @property
    def sm(self) -> ClockReading | None:
        """The SM clock, checked (None: not reported, or not a reading)."""
        return _reading(self.sm_mhz, self.sm_range_mhz)

    @property
    def mem(self) -> ClockReading | None:
        """The memory clock, checked (None: not reported, or not a reading)."""
        return _reading(self.mem_mhz, self.mem_range_mhz)

    @property
    def known(self) -> bool:
        return self.sm is not None or self.mem is not None


@dataclass(frozen=True, slots=True)
class ClocksRecord:
    """Both arms' GPU clocks over a window (the eval's speed, the load), or why they are
    unknown (`note`)."""

    source: str | None = None
    control: ClockRecord | None = None
    candidate: ClockRecord | None = None
    note: str | None = None

    @property
    def known(self) -> bool:
        """Both arms report a clock: the two can be compared."""
        return bool(self.control and self.control.known and self.candidate and self.candidate.known)


@dataclass(frozen=True, slots=True)
class SpeedStatus:
    before: Mapping[str, HistogramTotals] = _key(default={})
    after: Mapping[str, HistogramTotals] = _key(default={})
    started_at: float | None = None
    concurrency: int | None = None
    control: Mapping[str, float] = _key(default={})  # each figure by name, e.g. tpotMs
    candidate: Mapping[str, float] = _key(default={})
    clocks: ClocksRecord | None = None


@dataclass(frozen=True, slots=True)
class LoadStatus:
    """The load Job's measurement and what the throughput gate made of it.

    `summary` holds every figure per arm per stage (once); `throughputGain` is candidate over
    control output tok/s at production's load (a printer column), `bestGain` at each arm's best
    stage.
    """

    attempt: int | None = None
    job: str | None = None
    nonce_sha256: str | None = None  # the running attempt's nonce, hashed (as for the eval)
    concurrency: int | None = None  # production's concurrency the attempt was asked to run at
    lengths: str | None = None  # where the load's prompt/output lengths came from, in words
    throughput_gain: float | None = None
    best_gain: float | None = None
    summary: LoadSummary | None = None
    started_at: float | None = None  # when this attempt's Job was made: the clocks' window
    clocks: ClocksRecord | None = None  # both arms' GPU clocks over the load (Prometheus)


@dataclass(frozen=True, slots=True)
class CapacityStatus:
    """Candidate over control KV tokens; the tokens themselves are the arms' scans."""

    ratio: float | None = None


@dataclass(frozen=True, slots=True)
class PodScanRecord:
    pod: str | None = None
    attention_backend: str | None = None
    kv_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class PodCounters:
    ttft_sum: float | None = None
    ttft_count: float | None = None


@dataclass(frozen=True, slots=True)
class VerifyStatus:
    window_started_at: str | None = None
    samples: int | None = None
    last_sample_at: str | None = None
    restarts: int | None = None
    counters: Mapping[str, PodCounters] = _key(default={})


@dataclass(frozen=True, slots=True)
class PromotionStatus:
    patched: bool | None = None
    patched_at: str | None = None
    adopted_at: str | None = None
    generation: int | None = None
    pod_scan: PodScanRecord | None = None
    verify: VerifyStatus | None = None


@dataclass(frozen=True, slots=True)
class PullRequestStatus:
    """pullRequest mode: the pull request that proposes the tested change.

    Written ahead: `state` "opening" with the configuration hash before the forge is called,
    then the number and URL read back from the forge; a crash in between reuses the same
    branch, hence the same pull request."""

    provider: str | None = None
    repository: str | None = None
    base_branch: str | None = None
    path: str | None = None
    branch: str | None = None
    config_hash: str | None = None
    number: int | None = None
    url: str | None = None
    state: str | None = None  # opening, open, merged, closed
    merge_sha: str | None = None
    opened_at: str | None = None
    merged_at: str | None = None


@dataclass(frozen=True, slots=True)
class RevertStatus:
    """The write-ahead record of a revert: how it ends once the Deployment reads back clean."""

    phase: Phase | None = None
    reason: str | None = None
    message: str | None = None
    started_at: str | None = None
    attempts: int | None = None
    last_attempt_at: str | None = None
    last_error: str | None = None

    @property
    def end(self) -> Phase:
        """The phase the revert ends in: never Promoted, RolledBack when unknown."""
        phase = self.phase or Phase.ROLLED_BACK
        return phase if phase.terminal and phase is not Phase.PROMOTED else Phase.ROLLED_BACK

    @property
    def why(self) -> Reason:
        """The reason it ends with (PromotionReverted when none is recorded)."""
        return Reason.read(self.reason or Reason.PROMOTION_REVERTED)


@dataclass(frozen=True, slots=True)
class FirstAttempt:
    message: str | None = None
    attention_backend: str | None = None
    findings: tuple[str, ...] = _key(default=())


@dataclass(frozen=True, slots=True)
class RemediationStatus:
    code: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    args: tuple[str, ...] = _key(default=())
    env: Mapping[str, str] = _key(default={})
    attempt: int | None = None
    decided_at: str | None = None
    first_attempt: FirstAttempt | None = None


@dataclass(frozen=True, slots=True)
class GateResult:
    """One gate's result, under the gate's name: an unreadable outcome reads as Error.

    The judge makes it with a `Reason` (`judge.verdict.decide` weighs them); a stored reason is
    kept as written (a report shows one another release wrote), `why` reads it as a `Reason`."""

    gate: str = _key(named=True, default="")
    outcome: Outcome = Outcome.ERROR
    reason: str = ""
    message: str = ""

    @property
    def why(self) -> Reason:
        """The reason as this release knows it (Unknown for a word it does not know)."""
        return Reason.read(self.reason)


@dataclass(frozen=True, slots=True)
class VerdictKey:
    """What the verdict was reached on (`judge.verdictkey` reads and judges it); a change of it
    makes the verdict stale. `digest` is the other fields' fingerprint, always computed (a value
    given or read is not kept), and written beside them."""

    image: str | None = None  # the image reference evaluated (a tag can move)
    image_digest: str | None = None  # what the candidate arm ran (containerStatuses[].imageID)
    engine: str | None = None
    engine_version: str | None = None
    model: str | None = None
    revision: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None  # what the candidate's engine chose (its log)
    gpu_product: str | None = None  # the candidate canary's node's nvidia.com/gpu.product
    gpu_count: int | None = None  # the candidate container's nvidia.com/gpu limit (or request)
    config: str | None = None  # the tested container config (args, env, command), fingerprinted
    eval_policy: str | None = None  # the gates' settings, fingerprinted
    digest: str = ""

    def __post_init__(self) -> None:
        named = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del named["digest"]
        object.__setattr__(self, "digest", fingerprint(named))


def fingerprint(value: Mapping[str, Any]) -> str:
    """`config_hash` of `value` with its `sha256:` prefix (what a verdict key's fields hold)."""
    return "sha256:" + config_hash(value)


@dataclass(frozen=True, slots=True)
class VerdictRecord:
    decision: str | None = None
    outcome: Outcome | None = None
    message: str | None = None
    reasons: tuple[str, ...] = _key(default=())
    key: VerdictKey | None = None
    reused_from: str | None = None  # namespace/name of the rollout whose gates were reused


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str | None = None
    value: str | None = None


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    """`status` of a KVCacheRollout."""

    phase: Phase | None = None
    reason: str | None = None
    message: str | None = None
    progress: str | None = None  # the eval's progress in a few words (a printer column)
    observed_generation: int | None = None
    # The generation whose spec this run evaluates (set in Pending); a newer one supersedes the
    # run before anything is patched or merged, or starts a new run after its end.
    run_generation: int | None = None
    started_at: str | None = None
    phase_since: str | None = None
    finished_at: str | None = None
    # Manual approval: phaseSince of AwaitingApproval plus the operator's approval TTL
    # (approvalPolicy.expireAfter); past it the rollout ends ApprovalExpired.
    approval_expires_at: str | None = None
    consecutive_errors: int | None = None
    pending_actions: tuple[str, ...] = _key(default=())
    # What was evaluated (fingerprints only).
    engine: str | None = None
    container: str | None = None
    container_index: int | None = None
    port: int | None = None
    metrics_path: str | None = None
    model: str | None = None
    served_model: str | None = None
    evaluated_image: str | None = None
    config_hash: str | None = None
    previous: Mapping[str, JsonValue] = _key(
        default={},
        doc=f"The production container before the rollout (for the revert). {_CONTAINER}",
    )
    candidate: Mapping[str, JsonValue] = _key(
        default={}, doc=f"The candidate container (what promotion applies). {_CONTAINER}"
    )
    recommended_args: tuple[str, ...] = _key(default=())
    recommended_env: tuple[EnvVar, ...] = _key(default=())
    preflight: PreflightStatus | None = None
    arms: Mapping[str, ArmStatus] = _key(default={})
    eval: EvalStatus | None = None
    accuracy: AccuracyStatus | None = None
    capacity: CapacityStatus | None = None
    speed: SpeedStatus | None = None
    load: LoadStatus | None = None
    gates: Mapping[str, GateResult] = _key(default={})
    verdict: VerdictRecord | None = None
    promotion: PromotionStatus | None = None
    pull_request: PullRequestStatus | None = None
    revert: RevertStatus | None = None
    remediation: RemediationStatus | None = None
    conditions: tuple[Condition, ...] = _key(default=())

    @classmethod
    def from_dict(cls, raw: object) -> RolloutStatus:
        """Any value reads: what is not a status (or not this field's type) is unknown."""
        value: RolloutStatus = read_record(cls, raw)
        return _with_copied_arm_figures(value, raw) if isinstance(raw, Mapping) else value

    def to_dict(self) -> dict[str, Any]:
        return dict(_write(self))

    @property
    def reported(self) -> bool:
        """Report mode's end (AwaitingApproval, VerdictReported)."""
        return self.phase is Phase.AWAITING_APPROVAL and self.reason == VERDICT_REPORTED

    @property
    def ended(self) -> bool:
        return ended(self.phase or Phase.PENDING, self.reason)


# --- reading and writing -------------------------------------------------------------------------


def _with_copied_arm_figures(status: RolloutStatus, raw: Mapping[Any, Any]) -> RolloutStatus:
    arms = dict(status.arms)
    for arm in ("control", "candidate"):
        copied: dict[str, Any] = {}
        for section, key, target in COPIES:
            block = raw.get(section)
            block = block.get(arm) if isinstance(block, Mapping) else None
            if not isinstance(block, Mapping):
                continue
            value = block.get(key)
            where, _, leaf = target.rpartition(".")
            into = copied.setdefault(where, {}) if where else copied
            if value is not None and leaf not in into:
                into[leaf] = value
        scan: ScanRecord = read_record(ScanRecord, copied)
        if scan == ScanRecord():
            continue
        have = arms.get(arm) or ArmStatus()
        arms[arm] = dataclasses.replace(have, scan=_fill(have.scan, scan))
    return dataclasses.replace(status, arms=arms) if arms != status.arms else status


def _fill(have: Any, copied: Any) -> Any:
    """`have` with its unknown fields taken from `copied` (records of one type, or None)."""
    if have is None or copied is None:
        return copied if have is None else have
    if not dataclasses.is_dataclass(have) or isinstance(have, type):
        return have
    record: Any = type(have)
    return record(
        **{f.name: _fill(getattr(have, f.name), getattr(copied, f.name)) for f in _fields(record)}
    )
