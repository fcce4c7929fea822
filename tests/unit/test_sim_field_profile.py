"""The field-report engine profile (KVGATE_SIM_GPU=FIELD): its pools and, in engine seconds,
the shape the report describes. inference-perf's measurement of it is bench/bench_load_field.py.
"""

from __future__ import annotations

import pytest

from kvgate.sim.capacity import BLOCK_SIZE, plan_vllm
from kvgate.sim.config import GPUS, OPT_IN_GPUS, QWEN3_8B, SimConfigError, read_env
from kvgate.sim.engine import Request, Scheduler

FIELD = OPT_IN_GPUS["FIELD"]
PROMPT, OUTPUT = 20_000, 1_000  # ~21k tokens of context each, as in the report


def scheduler(gpu_name: str, fp8: bool) -> Scheduler:
    gpu = OPT_IN_GPUS.get(gpu_name) or GPUS[gpu_name]
    plan = plan_vllm(QWEN3_8B, gpu.memory_gib, 0.9, "fp8" if fp8 else "auto", (0, 33))
    return Scheduler(
        gpu=gpu, model=QWEN3_8B, kv_bytes_per_token=plan.bytes_per_token,
        capacity_tokens=plan.tokens, block_size=BLOCK_SIZE, max_num_seqs=256, speed=1e-9,
        fp8_kv=fp8,
    )  # fmt: skip


def one_round(
    fp8: bool, concurrency: int, gpu: str = "FIELD", prompt: int = PROMPT, output: int = OUTPUT
) -> tuple[float, float, int]:
    """Engine-time output tok/s, mean TPOT and preemptions of `concurrency` requests sent at once
    (the steps are driven directly: no thread, no wall clock)."""
    engine = scheduler(gpu, fp8)
    requests = [
        Request(prompt_tokens=prompt, pieces=[" x"] * output, finish_reason="length")
        for _ in range(concurrency)
    ]
    engine._waiting.extend(requests)
    while not all(r.done.is_set() for r in requests):
        engine._tick()
    end = max(r.finished_at or 0.0 for r in requests)
    tpot = (
        sum(((r.finished_at or 0.0) - (r.first_token or 0.0)) / (output - 1) for r in requests)
        / concurrency
    )
    return concurrency * output / end, tpot, engine.stats.preemptions


def test_field_is_opt_in_and_its_pools_are_the_reports() -> None:
    assert "FIELD" not in GPUS  # the spec-sheet list (and its error message) is unchanged
    assert read_env("vllm", {"KVGATE_SIM_GPU": "field"}).gpu == FIELD
    with pytest.raises(SimConfigError, match=r"\(known: L4, A100, H100\)$"):
        read_env("vllm", {"KVGATE_SIM_GPU": "T4"})
    bf16 = plan_vllm(QWEN3_8B, FIELD.memory_gib, 0.9, "auto", (0, 33)).tokens
    fp8 = plan_vllm(QWEN3_8B, FIELD.memory_gib, 0.9, "fp8", (0, 33)).tokens
    assert bf16 == pytest.approx(686_000, rel=0.01) and fp8 == pytest.approx(1_370_000, rel=0.01)
    assert 32 * (PROMPT + OUTPUT) <= bf16 < 64 * PROMPT  # holds 32 at ~21k, not 64
    assert fp8 >= 64 * (PROMPT + OUTPUT)


def test_decode_step_grows_with_kv_bytes_and_batch_and_fp8_pays_for_dequantizing() -> None:
    bf16, fp8 = scheduler("FIELD", False), scheduler("FIELD", True)
    empty = bf16.step_seconds([], 0)
    assert bf16.step_seconds([1_000] * 32, 0) > bf16.step_seconds([1_000] * 8, 0) > empty
    assert bf16.step_seconds([20_000] * 8, 0) > bf16.step_seconds([1_000] * 8, 0)
    # per cached token FP8 reads half the bytes but dequantizes: a little slower overall
    kv_bf16 = bf16.step_seconds([20_000] * 32, 0) - bf16.step_seconds([1] * 32, 0)
    kv_fp8 = fp8.step_seconds([20_000] * 32, 0) - fp8.step_seconds([1] * 32, 0)
    assert 1.0 < kv_fp8 / kv_bf16 < 1.5


def test_spec_sheet_gpus_pay_only_the_field_fits_fp8_dequantization() -> None:
    fp8_read = {}
    for gpu in [*GPUS.values(), FIELD]:
        # dequantizing costs the same multiple of reading the token's FP8 bytes everywhere
        fp8_read[gpu.name] = gpu.fp8_dequant_s_per_token / (
            QWEN3_8B.kv_bytes_per_token(1) / (gpu.bandwidth_gbs * 1e9 * 0.8)
        )
        if gpu is not FIELD:
            assert gpu.step_overhead_s == gpu.seq_overhead_s == 0.0
    assert list(fp8_read.values()) == pytest.approx([fp8_read["FIELD"]] * len(fp8_read))
    assert 1.3 < fp8_read["FIELD"] < 1.6
    l4, l4_bf16 = scheduler("L4", True), scheduler("L4", False)
    bytes_read = QWEN3_8B.weights_gib * (1 << 30) + 2_000 * QWEN3_8B.kv_bytes_per_token(1)
    dequant = 2_000 * GPUS["L4"].fp8_dequant_s_per_token
    assert l4.step_seconds([2_000], 0) == pytest.approx(bytes_read / l4._bandwidth + dequant)
    bf16_bytes = QWEN3_8B.weights_gib * (1 << 30) + 2_000 * QWEN3_8B.kv_bytes_per_token(2)
    assert l4_bf16.step_seconds([2_000], 0) == pytest.approx(bf16_bytes / l4._bandwidth)


def test_the_demos_l4_has_the_field_reports_shape_at_the_demos_load() -> None:
    # examples/vllm-deployment.yaml: 2,000 + 400 tokens; the BF16 pool holds 8 such requests
    def run(fp8: bool, concurrency: int) -> tuple[float, float, int]:
        return one_round(fp8, concurrency, gpu="L4", prompt=2_000, output=400)

    for concurrency in (1, 8):  # both pools hold them: FP8 a few percent slower per token
        (bf16, bf16_tpot, bf16_pre), (fp8, fp8_tpot, _) = (
            run(False, concurrency),
            run(True, concurrency),
        )
        assert bf16_pre == 0
        assert 1.0 < fp8_tpot / bf16_tpot < 1.05, concurrency
        assert bf16 > fp8
    # at the demo's 64 BF16 runs 8 at a time and preempts; FP8 runs twice as many
    bf16_64, _, bf16_pre_64 = run(False, 64)
    fp8_64, _, _ = run(True, 64)
    assert bf16_pre_64 > 0
    assert 1.5 < fp8_64 / bf16_64 < 2.0


def test_engine_time_has_the_field_reports_shape() -> None:
    bf16_8, bf16_tpot_8, _ = one_round(False, 8)
    bf16_32, bf16_tpot_32, bf16_pre_32 = one_round(False, 32)
    bf16_64, _, bf16_pre_64 = one_round(False, 64)
    fp8_8, fp8_tpot_8, _ = one_round(True, 8)
    _, fp8_tpot_32, _ = one_round(True, 32)
    fp8_64, _, fp8_pre_64 = one_round(True, 64)
    assert bf16_32 == pytest.approx(1558, rel=0.05)  # the report's best BF16
    assert fp8_64 == pytest.approx(2192, rel=0.05)  # the report's FP8 at 64
    assert fp8_64 / bf16_32 == pytest.approx(1.41, abs=0.05)
    # BF16 cannot hold 64: it preempts, the rest queue, and 64 buys nothing over 32
    assert bf16_pre_32 == 0 and bf16_pre_64 > 0 and fp8_pre_64 == 0
    assert bf16_64 <= bf16_32
    # FP8 a few percent slower per token wherever both fit
    assert 1.0 < fp8_tpot_8 / bf16_tpot_8 < 1.05
    assert 1.02 < fp8_tpot_32 / bf16_tpot_32 < 1.08
    assert bf16_8 > fp8_8
