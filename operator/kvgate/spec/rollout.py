"""What did the user ask for, and is it valid? `RolloutSpec` and its parts.

`RolloutSpec.from_dict` takes the CR's `spec` (after the apiserver applied the CRD defaults) and
checks meaning; it reports every bad field at once in an ExceptionGroup of `SpecError`s, each
naming its field. Structure is already checked by the CRD schema, but the operator also runs
against hand-written objects (tests, `kvgate preflight`), so nothing is assumed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvgate.errors import brief
from kvgate.spec import allowed as policy
from kvgate.spec import margins
from kvgate.spec.kvcache import KVCachePolicy, read_kv_cache
from kvgate.spec.reader import SpecReader, is_label, is_subdomain
from kvgate.vocabulary import (
    KV_DTYPES,
    Engine,
    ForgeProvider,
    GateMode,
    GitFileKind,
    PromotionMode,
    Remediation,
)

ACCURACY_TASKS: Final = ("gsm8k", "gsm8k_cot")
LONG_CONTEXT_TASKS: Final = ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
MIN_CONTEXT_LENGTH: Final = 256
MAX_CONTEXT_LENGTH: Final = 2**24
GSM8K_TEST_SIZE: Final = 1319


_ENV_NAME_RE: Final = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_COMMIT: Final = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True, slots=True)
class TargetRef:
    name: str
    container: str | None = None


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class SecretKeyRef:
    name: str
    key: str = "token"


@dataclass(frozen=True, slots=True)
class ModelRef:
    name: str | None = None  # hub id or local path; None: read from the container args
    revision: str | None = None
    token_secret: SecretKeyRef | None = None


@dataclass(frozen=True, slots=True)
class CapacityGate:
    mode: GateMode = GateMode.REQUIRE
    window_s: float = 300.0
    samples: int = 10
    usage_threshold: float = 0.9

    @property
    def interval_s(self) -> float:
        """Seconds between two pool samples."""
        return self.window_s / max(self.samples - 1, 1)

    @property
    def sampling_deadline_s(self) -> float:
        """How long preflight samples before it judges: three windows, and at least a minute
        more than one (a short window on a busy cluster gets its scrapes late)."""
        return max(3 * self.window_s, self.window_s + 60.0)


@dataclass(frozen=True, slots=True)
class ScalesGate:
    mode: GateMode = GateMode.WARN


@dataclass(frozen=True, slots=True)
class BackendGate:
    allowed: tuple[str, ...] = ()
    allow_fallback: bool = True


@dataclass(frozen=True, slots=True)
class LongContextTask:
    """The long-context needle task of the accuracy gate (`spec.gates.accuracy.longContext`).

    Judged per context-length bucket (paired non-inferiority at `margin_pp`, and the candidate
    at least `recovery_floor` of the control's score); the accuracy verdict is the worse of
    GSM8K's and this task's. `context_lengths` empty: 4096, 8192, ... up to the engine's max
    model length (read from the control's startup log). `tokenizer` None: the model's.
    `tokenizer_revision`: the hub commit (40 hex) the tokenizer is downloaded at; None: the
    branch head, whose commit the eval Job reports (status.accuracy.longContext).
    """

    tasks: tuple[str, ...] = ("niah_single_1",)
    items: int = 50
    margin_pp: float = 10.0
    recovery_floor: float = 0.95
    context_lengths: tuple[int, ...] = ()
    tokenizer: str | None = None
    tokenizer_revision: str | None = None


@dataclass(frozen=True, slots=True)
class AccuracyGate:
    """The paired accuracy eval. `mode` off: no eval Job at all, the gate reads Skipped (for a
    model whose accuracy cannot be measured, e.g. random weights; never the default)."""

    mode: GateMode = GateMode.REQUIRE
    task: str = "gsm8k"
    questions: int = 500
    few_shot: int = 5
    margin_pp: float = margins.DEFAULT_MARGIN_PP  # by policy class: kvgate.spec.margins
    confidence: float = 0.95
    sequential: bool = True
    chunk: int = 100
    long_context: LongContextTask | None = None  # None: GSM8K only


@dataclass(frozen=True, slots=True)
class DivergenceGate:
    """The token-level divergence screen (`spec.gates.divergence`), run in the eval Job;
    `max_tokens` None: the engine's max model length (from the control's startup log)."""

    mode: GateMode = GateMode.OFF
    documents: int = 4
    max_tokens: int | None = None
    factor: float = 10.0
    logprobs: int = 5


@dataclass(frozen=True, slots=True)
class ThroughputGainGate:
    """Measured output tok/s, candidate over control, at production's load (the load Job), with
    optional p99 SLOs (milliseconds): a stage that misses one does not count as served."""

    min_ratio: float = 1.3
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    max_concurrency: int = 128
    max_clock_difference: float = 0.05
    # One load attempt's bound: the Job's activeDeadlineSeconds (`kvgate load-job` stops its
    # runs a margin before, so its summary still gets printed). Past it the attempt is an
    # error: retried within canary.evalRetries, then Failed/LoadError.
    timeout_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class CapacityGainGate:
    min_ratio: float = 1.8
    throughput_gain: ThroughputGainGate | None = None  # None: throughput not measured (off)


@dataclass(frozen=True, slots=True)
class SpeedGate:
    concurrency: tuple[int, ...] = ()
    max_tpot_regression: float = 0.1
    requests: int = 64
    # Arms whose GPU clocks (DCGM, through Prometheus) differ by more than this fraction are
    # not compared: a speed difference at different clocks is the clocks' as much as the KV's.
    max_clock_difference: float = 0.05


@dataclass(frozen=True, slots=True)
class CanarySpec:
    startup_timeout_s: float = 900.0
    eval_timeout_s: float = 3600.0
    eval_retries: int = 2
    resources: Mapping[str, Any] = field(default_factory=dict)
    remediation: Remediation = Remediation.OFF


# What a `pullRequest` promotion's fields may hold.
_API_URL: Final = re.compile(r"^https?://[^/@\s]+(/[^\s]*)?\Z")
_REPOSITORY: Final = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\Z")
_BRANCH: Final = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]{0,199}\Z")
VALUES_KEY: Final = re.compile(r"^[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63}){0,7}\Z")
DEFAULT_APPLY_DEADLINE_S: Final = 1800.0


@dataclass(frozen=True, slots=True)
class PullRequestSpec:
    """`spec.promotion.pullRequest`: where the tested change is proposed, and how."""

    provider: ForgeProvider
    api_url: str
    repository: str  # owner/name (GitLab: group/project)
    path: str  # the file kvgate owns, relative to the repository root
    token_secret: SecretKeyRef
    base_branch: str = "main"
    kind: GitFileKind = GitFileKind.KUSTOMIZE_PATCH
    values_key: str | None = None  # helmValues: the dotted key the change goes under
    # Merged but not applied to the Deployment within this long: Stalled.
    apply_deadline_s: float = DEFAULT_APPLY_DEADLINE_S


@dataclass(frozen=True, slots=True)
class VerdictReuse:
    """spec.reuseVerdict: instead of the eval and the load, take the gates of a Promoted rollout
    in this namespace whose verdict key is this candidate's and which ended at most `max_age_s`
    ago. Off unless the field is set; `kvgate.flow.reuse` says what may be reused."""

    max_age_s: float = 86400.0


@dataclass(frozen=True, slots=True)
class PromotionSpec:
    mode: PromotionMode = PromotionMode.AUTO
    verify_window_s: float = 600.0
    verify_samples: int = 5  # observations over the window, each must pass
    pull_request: PullRequestSpec | None = None  # set exactly when mode is pullRequest

    @property
    def verify_interval_s(self) -> float:
        """Seconds between two verify samples."""
        return self.verify_window_s / max(self.verify_samples - 1, 1)


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """The meaning of a KVCacheRollout `spec`."""

    target: TargetRef
    engine: Engine = Engine.AUTO
    kv_cache_dtype: str = "fp8"  # = kv_cache.format (the v1alpha1 name every consumer reads)
    kv_cache: KVCachePolicy = field(default_factory=KVCachePolicy)
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[EnvVar, ...] = ()
    model: ModelRef = field(default_factory=ModelRef)
    capacity: CapacityGate = field(default_factory=CapacityGate)
    scales: ScalesGate = field(default_factory=ScalesGate)
    backend: BackendGate = field(default_factory=BackendGate)
    accuracy: AccuracyGate = field(default_factory=AccuracyGate)
    divergence: DivergenceGate = field(default_factory=DivergenceGate)
    capacity_gain: CapacityGainGate = field(default_factory=CapacityGainGate)
    speed: SpeedGate | None = None
    canary: CanarySpec = field(default_factory=CanarySpec)
    promotion: PromotionSpec = field(default_factory=PromotionSpec)
    reuse_verdict: VerdictReuse | None = None  # None: every rollout runs its own eval (default)

    @classmethod
    def from_dict(
        cls, spec: Mapping[str, Any], *, allow: policy.Allowlist | None = None
    ) -> RolloutSpec:
        """Parse a CR spec; raises ExceptionGroup[SpecError] listing every bad field.

        `allow` is what extraArgs/extraEnv may hold (default: the built-in lists of
        `kvgate.spec.allowed`; the operator passes its configured `OperatorConfig.allowlist`).
        """
        allow = policy.BUILTIN if allow is None else allow
        r = SpecReader(spec, "spec")
        target = r.section("targetRef", required=True)
        target_ref = TargetRef(
            name=target.string("name", required=True) or "",
            container=target.string("container"),
        )
        if target_ref.name and not is_subdomain(target_ref.name):
            target.error("name", f"{brief(target_ref.name)} is not a Kubernetes object name")
        if target_ref.container and not is_label(target_ref.container):
            target.error("container", f"{brief(target_ref.container)} is not a container name")
        engine = r.choice("engine", Engine, Engine.AUTO)
        dtype = r.one_of("kvCacheDtype", KV_DTYPES, "fp8")
        if engine is Engine.SGLANG and dtype == "fp8" and not r.section("kvCache").present:
            r.error("kvCacheDtype", "sglang does not accept fp8; use fp8_e4m3 or fp8_e5m2")
        legacy = r.raw("kvCacheDtype")
        policy_engine = None if engine is Engine.AUTO else engine.value
        kv_cache = read_kv_cache(
            r, policy_engine, legacy if isinstance(legacy, str) and legacy in KV_DTYPES else None
        )
        dtype = kv_cache.format
        extra_args = tuple(r.list_of("extraArgs", str, "a string"))
        if not any(e.field.startswith("spec.extraArgs") for e in r.errors):
            for v in policy.check_args(extra_args, policy_engine, allow):
                r.error(f"extraArgs[{v.index}]", v.message)
        extra_env = tuple(_env_vars(r, policy_engine, allow))
        m = r.section("model")
        secret = m.section("tokenSecretRef")
        model = ModelRef(
            name=m.string("name"),
            revision=m.string("revision"),
            token_secret=_secret_ref(secret) if secret.present else None,
        )
        g = r.section("gates")
        cap = g.section("capacity")
        capacity = CapacityGate(
            mode=cap.choice("mode", GateMode, GateMode.REQUIRE),
            window_s=cap.duration("window", 300.0, minimum=1.0),
            samples=cap.integer("samples", 10, 2, 120),
            usage_threshold=cap.number("usageThreshold", 0.9, 0.0, 1.0),
        )
        scales = ScalesGate(mode=g.section("scales").choice("mode", GateMode, GateMode.WARN))
        be = g.section("backend")
        backend = BackendGate(
            allowed=tuple(be.list_of("allowed", str, "a string")),
            allow_fallback=be.boolean("allowFallback", True),
        )
        acc = g.section("accuracy")
        questions = acc.integer("questions", 500, 20, GSM8K_TEST_SIZE)
        accuracy = AccuracyGate(
            mode=acc.choice("mode", GateMode, GateMode.REQUIRE),
            task=acc.one_of("task", ACCURACY_TASKS, "gsm8k"),
            questions=questions,
            few_shot=acc.integer("fewShot", 5, 0, 8),
            margin_pp=acc.number(
                "margin",
                margins.DEFAULT_MARGIN_PP,
                0.0,
                margins.max_margin_pp(kv_cache.policy_class),
                exclusive_min=True,
            ),
            confidence=acc.number("confidence", 0.95, 0.8, 0.999),
            sequential=acc.boolean("sequential", True),
            chunk=acc.integer("chunk", 100, 10, GSM8K_TEST_SIZE),
            long_context=_long_context(acc.section("longContext")),
        )
        for where, problem in margins.margin_problems(
            kv_cache.policy_class,
            kv_cache.format,
            accuracy.margin_pp if acc.raw("margin") is not None else None,
            accuracy.mode is not GateMode.OFF,
        ):
            r.error(where, problem)
        if accuracy.chunk > questions:
            acc.error(
                "chunk",
                f"{accuracy.chunk} exceeds questions ({questions}); use a chunk <= questions",
            )
        if accuracy.mode is GateMode.WARN:
            acc.error("mode", "'warn' is not offered: an accuracy loss is never a warning; use "
                      "require or off")  # fmt: skip
        dv = g.section("divergence")
        divergence = DivergenceGate(
            mode=dv.choice("mode", GateMode, GateMode.OFF),
            documents=dv.integer("documents", 4, 1, 100),
            max_tokens=dv.optional("maxTokens", dv.integer, 8192, 512, 2**21),
            factor=dv.number("factor", 10.0, 1.0, 1e6),
            logprobs=dv.integer("logprobs", 5, 1, 20),
        )
        cg = g.section("capacityGain")
        tg = cg.section("throughputGain")
        gain = CapacityGainGate(
            min_ratio=cg.number("minRatio", 1.8, 1.0, 8.0),
            throughput_gain=(
                ThroughputGainGate(
                    min_ratio=tg.number("minRatio", 1.3, 0.0, 100.0, exclusive_min=True),
                    ttft_p99_ms=tg.optional(
                        "ttftP99Ms", tg.number, 0.0, 0.0, 3.6e6, exclusive_min=True
                    ),
                    tpot_p99_ms=tg.optional(
                        "tpotP99Ms", tg.number, 0.0, 0.0, 6e4, exclusive_min=True
                    ),
                    max_concurrency=tg.integer("maxConcurrency", 128, 1, 4096),
                    max_clock_difference=tg.number("maxClockDifference", 0.05, 0.0, 1.0),
                    timeout_s=tg.duration("timeout", 1800.0, minimum=10.0),
                )
                if tg.present
                else None
            ),
        )
        sp = g.section("speed")
        speed = (
            SpeedGate(
                concurrency=tuple(sp.list_of("concurrency", int, "an integer")),
                max_tpot_regression=sp.number("maxTpotRegression", 0.1, 0.0, 10.0),
                requests=sp.integer("requests", 64, 1, 10000),
                max_clock_difference=sp.number("maxClockDifference", 0.05, 0.0, 1.0),
            )
            if sp.present
            else None
        )
        c = r.section("canary")
        canary = CanarySpec(
            startup_timeout_s=c.duration("startupTimeout", 900.0, minimum=1.0),
            eval_timeout_s=c.duration("evalTimeout", 3600.0, minimum=1.0),
            eval_retries=c.integer("evalRetries", 2, 0, 10),
            resources=c.mapping("resources"),
            remediation=c.choice("remediation", Remediation, Remediation.OFF),
        )
        if c.raw("evalImage") is not None:
            c.error(
                "evalImage",
                "the eval image is set by the operator (KVGATE_EVAL_IMAGE, chart value "
                "evalImage), not by a rollout; remove this field",
            )
        p = r.section("promotion")
        promotion = PromotionSpec(
            mode=p.choice("mode", PromotionMode, PromotionMode.AUTO),
            verify_window_s=p.duration("verifyWindow", 600.0, minimum=0.0),
            verify_samples=p.integer("verifySamples", 5, 1, 100),
            pull_request=_pull_request(p),
        )
        rv = r.section("reuseVerdict")
        max_age = rv.duration("maxAge", 86400.0, minimum=60.0)
        reuse = VerdictReuse(max_age_s=max_age) if rv.present else None
        if accuracy.mode is GateMode.OFF and (
            divergence.mode is not GateMode.OFF or speed is not None
        ):
            # Both are measured in the eval Job's window, which accuracy off does not open.
            acc.error("mode", "off runs no eval Job, which the divergence screen and the speed "
                      "gate need; turn them off too, or keep accuracy on")  # fmt: skip
        r.raise_errors()
        return cls(
            target=target_ref,
            engine=engine,
            kv_cache_dtype=dtype,
            kv_cache=kv_cache,
            extra_args=extra_args,
            extra_env=extra_env,
            model=model,
            capacity=capacity,
            scales=scales,
            backend=backend,
            accuracy=accuracy,
            divergence=divergence,
            capacity_gain=gain,
            speed=speed,
            canary=canary,
            promotion=promotion,
            reuse_verdict=reuse,
        )


def _pull_request(p: SpecReader) -> PullRequestSpec | None:
    """spec.promotion.pullRequest: required by mode pullRequest, refused by the others."""
    mode = p.raw("mode")
    pr = p.section("pullRequest")
    if mode != PromotionMode.PULL_REQUEST.value:
        if pr.present:
            p.error("pullRequest", f"is only read in mode pullRequest (mode is {mode or 'auto'})")
        return None
    if not pr.present:
        p.error("pullRequest", "is required in mode pullRequest (provider, apiUrl, repository, "
                "path, tokenSecretRef)")  # fmt: skip
        return None
    provider = pr.choice("provider", ForgeProvider, ForgeProvider.GITHUB)
    if pr.raw("provider") is None:
        pr.error("provider", "is required: one of gitea, github, gitlab")
    api_url = pr.string("apiUrl", required=True) or ""
    if api_url and not _API_URL.match(api_url):
        pr.error("apiUrl", f"{api_url[:80]!r} is not an http(s) URL without credentials")
    repository = pr.string("repository", required=True) or ""
    if repository and (not _REPOSITORY.match(repository) or ".." in repository):
        pr.error("repository", f"{repository[:80]!r} is not owner/name")
    base = pr.string("baseBranch") or "main"
    if not _BRANCH.match(base) or ".." in base or base.startswith("kvgate/"):
        pr.error("baseBranch", f"{base[:80]!r} is not a branch kvgate may propose to")
    path = pr.string("path", required=True) or ""
    parts = path.split("/")
    if path and (
        path.startswith("/")
        or "\\" in path
        or any(part in ("", ".", "..") for part in parts)
        or not path.endswith((".yaml", ".yml"))
        or len(path) > 512
    ):
        pr.error("path", f"{path[:80]!r} is not a relative path of a .yaml or .yml file")
    kind = pr.choice("kind", GitFileKind, GitFileKind.KUSTOMIZE_PATCH)
    values_key = pr.string("valuesKey")
    if kind is GitFileKind.HELM_VALUES and values_key is None:
        pr.error("valuesKey", "is required with kind helmValues (e.g. vllm.container)")
    elif kind is not GitFileKind.HELM_VALUES and values_key is not None:
        pr.error("valuesKey", "is only read with kind helmValues")
    elif values_key is not None and not VALUES_KEY.match(values_key):
        pr.error("valuesKey", f"{values_key[:80]!r} is not a dotted key (a.b.c)")
    token_secret = _secret_ref(pr.section("tokenSecretRef", required=True))
    return PullRequestSpec(
        provider=provider,
        api_url=api_url,
        repository=repository,
        path=path,
        token_secret=token_secret,
        base_branch=base,
        kind=kind,
        values_key=values_key,
        apply_deadline_s=pr.duration("applyDeadline", DEFAULT_APPLY_DEADLINE_S, minimum=1.0),
    )


def _secret_ref(secret: SpecReader) -> SecretKeyRef:
    name = secret.string("name", required=secret.present)
    return SecretKeyRef(name or "", secret.string("key") or "token")


def _long_context(lc: SpecReader) -> LongContextTask | None:
    """spec.gates.accuracy.longContext: absent means GSM8K only."""
    if not lc.present:
        return None
    tasks = lc.list_of("tasks", str, "a string") if lc.raw("tasks") is not None else None
    for i, t in enumerate(tasks or []):
        if t not in LONG_CONTEXT_TASKS:
            lc.error(f"tasks[{i}]", f"{t!r} is not one of {', '.join(LONG_CONTEXT_TASKS)}")
    if tasks is not None and not tasks:
        lc.error("tasks", "is empty; name at least one task or remove longContext")
    lengths = lc.list_of("contextLengths", int, "an integer")
    for i, n in enumerate(lengths):
        if not MIN_CONTEXT_LENGTH <= n <= MAX_CONTEXT_LENGTH:
            lc.error(
                f"contextLengths[{i}]",
                f"{n} is outside [{MIN_CONTEXT_LENGTH}, {MAX_CONTEXT_LENGTH}]",
            )
    tokenizer = lc.string("tokenizer")
    if tokenizer is not None and (len(tokenizer) > 512 or not tokenizer.isprintable()):
        lc.error("tokenizer", "a hub repo id or a path of at most 512 printable characters")
    revision = lc.string("tokenizerRevision")
    if revision is not None and not is_commit(revision):
        lc.error(
            "tokenizerRevision",
            f"{revision[:60]!r} is not a commit; use the 40 hex digits of a hub commit "
            "(a branch or tag can move)",
        )
    elif revision is not None and tokenizer is not None and is_local_path(tokenizer):
        lc.error(
            "tokenizerRevision", f"tokenizer {tokenizer!r} is a path; a revision pins a hub repo"
        )
    return LongContextTask(
        tasks=tuple(dict.fromkeys(tasks)) if tasks else ("niah_single_1",),
        items=lc.integer("items", 50, 5, 1000),
        margin_pp=lc.number("margin", 10.0, 0.0, 50.0, exclusive_min=True),
        recovery_floor=lc.number("recoveryFloor", 0.95, 0.0, 1.0),
        context_lengths=tuple(sorted(set(lengths))),
        tokenizer=tokenizer,
        tokenizer_revision=revision,
    )


def is_commit(value: str) -> bool:
    """A full git commit id as the hub names it: 40 lower-case hex digits."""
    return _COMMIT.fullmatch(value) is not None


def is_local_path(name: str) -> bool:
    """A tokenizer or model named by a path in the image, not a hub repo id."""
    return name.startswith(("/", "./", "../", "~"))


def _env_vars(r: SpecReader, engine: str | None, allow: policy.Allowlist) -> list[EnvVar]:
    """spec.extraEnv: valid names on the allowlist, literal printable values."""
    out: list[EnvVar] = []
    raw = r.raw("extraEnv")
    if raw is None:
        return out
    if not isinstance(raw, list):
        r.error("extraEnv", f"{raw!r} is not a list; use [{{name: X, value: Y}}]")
        return out
    for i, item in enumerate(raw):
        where = f"extraEnv[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            r.error(where, f"{item!r} is not {{name, value}}; give a name")
            continue
        name = item["name"]
        if not _ENV_NAME_RE.match(name):
            r.error(f"{where}.name", f"{name!r} is not a valid environment variable name")
            continue
        refused = policy.check_env_name(name, engine, allow)
        if refused is not None:
            r.error(f"{where}.name", refused)
            continue
        value = item.get("value", "")
        value = "" if value is None else value
        if not isinstance(value, str):
            r.error(f"{where}.value", f"{value!r} is not a string; quote it")
            continue
        bad_value = policy.check_env_value(value)
        if bad_value is not None:
            r.error(f"{where}.value", f"the value of {name} {bad_value}")
            continue
        out.append(EnvVar(name, value))
    return out
