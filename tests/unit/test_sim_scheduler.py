"""kvgate.sim's scheduler: a fixed KV pool, queueing, preemption and engine-time latencies."""

from __future__ import annotations

import pytest

from kvgate.sim.config import GPUS, QWEN3_8B
from kvgate.sim.engine import EngineDead, Request, Scheduler

BF16, FP8 = QWEN3_8B.kv_bytes_per_token(2), QWEN3_8B.kv_bytes_per_token(1)


def make(capacity: int, per_token: int = BF16, max_seqs: int = 256) -> Scheduler:
    scheduler = Scheduler(
        gpu=GPUS["L4"], model=QWEN3_8B, kv_bytes_per_token=per_token, capacity_tokens=capacity,
        block_size=16, max_num_seqs=max_seqs, speed=1e-4,
    )  # fmt: skip
    scheduler.start()
    return scheduler


def request(prompt: int, output: int) -> Request:
    return Request(prompt_tokens=prompt, pieces=[" x"] * output, finish_reason="length")


def test_decode_step_reads_weights_and_kv() -> None:
    bf16, fp8 = make(10_000), make(10_000, FP8)
    try:
        contexts = [2_000] * 16
        # an L4 reads 15.3 GiB of weights per step at ~240 GB/s: ~68 ms
        assert 0.06 < bf16.step_seconds([], 0) < 0.08
        gain_bf16 = bf16.step_seconds(contexts, 0) - bf16.step_seconds([], 0)
        gain_fp8 = fp8.step_seconds(contexts, 0) - fp8.step_seconds([], 0)
        assert gain_fp8 == pytest.approx(gain_bf16 / 2)  # FP8 reads half the KV bytes
        assert bf16.step_seconds([], 2_000) > bf16.step_seconds([], 0) + 0.1  # prefill compute
    finally:
        bf16.stop()
        fp8.stop()


def test_requests_beyond_the_pool_wait_then_all_finish() -> None:
    scheduler = make(capacity=1_600)  # 100 blocks
    requests = [request(400, 200) for _ in range(8)]  # 600 tokens each at the end
    for r in requests:
        scheduler.submit(r)
    with scheduler.lock:
        waiting_soon = scheduler.stats.waiting
    assert all(r.done.wait(30) for r in requests)
    assert all(r.error is None and r.generated == 200 for r in requests)
    stats = scheduler.stats
    assert waiting_soon >= 5
    assert stats.preemptions > 0  # prompts fit on admission, then decodes outgrow the pool
    assert stats.finished["length"] == 8 and stats.generation_tokens >= 8 * 200
    assert stats.running == stats.waiting == stats.used_blocks == 0
    assert stats.ttft.n == 8 and stats.queue_time.n == 8
    scheduler.stop()


def test_latencies_are_engine_time_not_wall_time() -> None:
    scheduler = make(capacity=100_000)
    r = scheduler.submit(request(100, 50))
    assert r.done.wait(30)
    step = scheduler.step_seconds([101], 0)
    # first token after one prefill+decode step, then 49 decode steps: real-GPU scale seconds
    assert scheduler.stats.ttft.total == pytest.approx(scheduler.step_seconds([100], 100), rel=0.05)
    assert scheduler.stats.e2e.total == pytest.approx(
        scheduler.stats.ttft.total + 49 * step, rel=0.05
    )
    assert scheduler.stats.itl.n == 49
    scheduler.stop()


def test_a_request_larger_than_the_pool_is_aborted() -> None:
    scheduler = make(capacity=320)
    r = scheduler.submit(request(1_000, 5))
    assert r.done.wait(10)
    assert r.error == "request does not fit in the KV cache"
    assert scheduler.stats.finished["abort"] == 1
    scheduler.stop()


def test_max_num_seqs_caps_the_batch() -> None:
    scheduler = make(capacity=100_000, max_seqs=2)
    requests = [scheduler.submit(request(10, 400)) for _ in range(5)]
    peak = 0
    while not all(r.done.is_set() for r in requests):
        with scheduler.lock:
            peak = max(peak, scheduler.stats.running)
    assert peak == 2
    scheduler.stop()


def test_dead_engine_fails_requests_in_flight() -> None:
    scheduler = make(capacity=100_000)
    scheduler.speed = 1.0  # slow enough to still be running
    r = scheduler.submit(request(10, 1_000))
    scheduler.die("CUDA error")
    assert r.done.wait(5) and r.error == "CUDA error"
    with pytest.raises(EngineDead):
        scheduler.submit(request(1, 1))


def test_halt_from_a_finish_stops_the_step_at_once() -> None:
    # GIVEN a fault that fires when the 3rd request finishes (requests finish in the same step)
    finished: list[Request] = []

    def on_finished(r: Request) -> None:
        finished.append(r)
        if len(finished) == 3:
            scheduler.halt()

    scheduler = Scheduler(
        gpu=GPUS["L4"], model=QWEN3_8B, kv_bytes_per_token=BF16, capacity_tokens=100_000,
        block_size=16, max_num_seqs=256, speed=1e-4, on_finished=on_finished,
    )  # fmt: skip
    requests = [scheduler.submit(request(10, 5)) for _ in range(10)]
    scheduler.start()
    assert _wait_for(lambda: scheduler.dead), "never halted"
    scheduler.die("CUDA error")
    assert sum(r.error is None for r in requests) == 3  # exactly N answered, the rest fail
    assert all(r.done.is_set() for r in requests)


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return False
