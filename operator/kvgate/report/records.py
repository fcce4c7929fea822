"""The report's view model: small frozen records of what a rollout's status says (the package
docstring, `kvgate.report`, says who builds and who renders them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgate.records.evalsummary import ArmAccuracy
from kvgate.records.loadresult import StagePoint
from kvgate.records.status import ClocksRecord


@dataclass(frozen=True, slots=True)
class Accuracy:
    """The paired accuracy gate as the eval summary reports it."""

    verdict: str | None
    task: str | None
    margin: float | None
    confidence: float | None
    questions_used: int | None
    stopped_early: bool | None
    arms: dict[str, ArmAccuracy]  # as status keeps them, figures checked (`view.read_accuracy`)
    difference: float | None
    difference_ci: tuple[float, float] | None
    mcnemar_p: float | None
    discordant: tuple[int, int] | None
    ruled_out: float | None
    questions_needed: int | None
    error: str | None
    # The look-adjusted one-sided bounds the verdict rests on, and how many looks it took.
    lower_bound: float | None = None
    upper_bound: float | None = None
    shown_worse_by: float | None = None  # a fail: the candidate is worse by at least this
    fail_confidence: float | None = None
    looks: int | None = None  # the look the gate stopped at
    # A fail the report's headline states (the rollout ended on it): the section refers to it
    # instead of saying it again (first-hour-2 #26).
    in_headline: bool = False


@dataclass(frozen=True, slots=True)
class Finding:
    """One gate's result: a condition (or a findings entry) with its reason and message."""

    gate: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class LogLine:
    """A notable startup-log finding of one arm: a warning or an error, with its remedy."""

    arm: str
    severity: str
    code: str
    text: str
    hint: str


@dataclass(frozen=True, slots=True)
class ArmCapacity:
    """One arm's KV cache as its engine reported it at startup."""

    arm: str
    kv_dtype: str | None
    backend: str | None
    kv_tokens: float | None
    max_concurrency: float | None


@dataclass(frozen=True, slots=True)
class SpeedMetric:
    """One measured speed figure (the operator's key, e.g. `tokensPerSecond`) per arm."""

    key: str
    values: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class Speed:
    """`status.speed`: the figures per arm, and the GPU clocks they were measured at."""

    metrics: list[SpeedMetric]
    clocks: ClocksRecord | None


@dataclass(frozen=True, slots=True)
class LongContextBucket:
    """One context length of the long-context task: both arms' scores and the verdict."""

    context_length: int | None
    control: float | None
    candidate: float | None
    recovery: float | None
    lower: float | None
    verdict: str
    reason: str


@dataclass(frozen=True, slots=True)
class DivergenceBucket:
    """One position bucket of the teacher-forced divergence: the A/A floor and the candidate."""

    bucket: str
    floor_kl: float | None
    candidate_kl: float | None
    floor_top1: float | None
    candidate_top1: float | None
    flagged: bool


@dataclass(frozen=True, slots=True)
class Header:
    """Who the rollout is and where it stands: identity, target, mode, phase, message."""

    namespace: str
    name: str
    target: str
    mode: str | None
    kv_cache_dtype: str | None
    phase: str
    message: str | None
    questions_planned: int | None = None  # spec.accuracy.questions


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a rollout stands in time, and a running eval's latest look."""

    running_s: float | None  # since startedAt (None once finished, or unknown)
    phase_s: float | None  # since phaseSince
    look: int | None = None
    looks_planned: int | None = None
    questions: int | None = None
    questions_planned: int | None = None
    difference: float | None = None  # candidate minus control so far, a fraction


@dataclass(frozen=True, slots=True)
class Headline:
    """The message to lead with: the classified cause, the remedy and where it goes.

    `raw` is a crashed engine's own log line (cut short: often a long command), kept for the
    details; `where` says which spec field takes the remedy.
    """

    cause: str
    remedy: str | None = None
    where: str | None = None
    raw: str | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """`status.load`: both arms' stages by concurrency (ascending), production's marked."""

    production_concurrency: int | None
    gain: float | None  # candidate / control output tok/s at production's load
    best_gain: float | None
    levels: list[int]
    arms: dict[str, dict[int, StagePoint]]
    lengths: str | None = None  # the workload's request lengths and where they were read
    clocks: ClocksRecord | None = None  # the arms' GPU clocks over the load's run
    preemptions: dict[str, float] = field(default_factory=dict)  # by arm, over the load
    time_scale: float | None = None  # a sped-up simulator's wall seconds per engine second


@dataclass(frozen=True)
class ReportView:
    """Everything the report shows of one rollout, computed once (`assemble.build`); the text, HTML and
    SVG renderers take it and read nothing else."""

    header: Header
    finished: bool  # what is missing now never comes
    headline: Headline | None
    verdict: str | None
    production: str | None
    approval: list[str]
    duration: str | None
    progress: Progress | None
    remediation: list[str]
    preflight: list[str]
    findings: list[Finding]
    log_lines: list[LogLine]
    accuracy: Accuracy | None
    long_context: list[LongContextBucket]
    divergence: list[DivergenceBucket]
    capacity: list[ArmCapacity]
    kv_tokens: dict[str, float | None]
    capacity_gain: float | None
    speed: Speed | None
    load: Load | None
    args: list[str]
    args_heading: str
