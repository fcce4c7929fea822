"""The batch scheduler: a KV pool of fixed size, running and waiting queues, decode steps.

One thread runs steps. A step admits waiting requests whose prompt fits the pool, gives
every running request one token, and preempts the newest requests (recompute, as vLLM V1
does) when the pool runs out. A decode step costs the time to read the weights plus the
KV of every running sequence, so an FP8 pool (half the bytes) decodes long contexts faster,
unless the GPU profile carries fitted per-step, per-sequence and FP8-dequantization costs
(the field-report profile does: docs/engine-model.md).
Times in metrics are engine seconds: the sum of the modelled step times, so they read
like a real GPU's whatever KVGATE_SIM_SPEED is (the wall clock only paces the steps).
"""

from __future__ import annotations

import bisect
import itertools
import math
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from kvgate.sim.config import GIB, GpuProfile, LoadSpec, ModelProfile

MIN_TICK = 0.002  # wall seconds; shorter steps are batched into one tick to spare the CPU
BANDWIDTH_EFFICIENCY = 0.8
PREFILL_MFU = 0.5
PREFIX_CACHE_BLOCKS = 1 << 16  # block hashes remembered for prefix hits (LRU)


class Histogram:
    """Cumulative buckets that take a count per observation (one decode step = many tokens)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.total += value * count
        self.n += count

    def cumulative(self) -> list[tuple[str, int]]:
        """`(le, cumulative count)` rows; `le` spelled as prometheus_client's own Histogram
        does (`1000.0`, but `1e+06`), so token-count bounds read like the engines'."""
        running, rows = 0, []
        for bound, count in zip([*self.bounds, math.inf], self.counts, strict=True):
            running += count
            rows.append((floatToGoString(bound), running))
        return rows


TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip


@dataclass
class Stats:
    """Everything /metrics reports; mutated only under the scheduler lock."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    # vLLM's prefix cache counters, in tokens: queried (0 while caching is off, as vLLM counts
    # nothing then) and found cached, by whole blocks
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    last_preemptions: int = 0  # in the last scheduler step (SGLang's gauge)
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    # Each finished request's prompt and generated tokens; the engine's bounds are set by the
    # Scheduler (vLLM's depend on max-model-len, SGLang's on its version: sim/metrics.py).
    prompt_lengths: Histogram = field(default_factory=lambda: Histogram(()))
    output_lengths: Histogram = field(default_factory=lambda: Histogram(()))
    running: int = 0
    waiting: int = 0
    used_blocks: int = 0
    used_tokens: int = 0
    gen_throughput: float = 0.0


_ids = itertools.count()


@dataclass
class Request:
    """One sequence. `pieces` is the text the engine will emit, one token each."""

    prompt_tokens: int
    pieces: list[str]
    finish_reason: str  # "stop" or "length", decided when the text was planned
    on_done: Callable[[Request], None] | None = None
    stream: queue.Queue[str | None] | None = None
    counted: bool = True  # a client request (not warm-up, health probe or synthetic load)
    stop_reason: str | None = None  # the stop string that ended it (vLLM reports it)
    id: int = field(default_factory=lambda: next(_ids))
    generated: int = 0
    arrival: float = 0.0  # engine seconds, set by submit()
    admitted: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    # one hash per whole block of the prompt, each over every token up to the block's end
    prefix_blocks: tuple[int, ...] = ()

    @property
    def target(self) -> int:
        return max(1, len(self.pieces))

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated


class EngineDead(RuntimeError):
    """The engine stopped; requests in flight fail."""


class Scheduler:
    """Continuous batching over a fixed KV pool."""

    def __init__(
        self,
        *,
        gpu: GpuProfile,
        model: ModelProfile,
        kv_bytes_per_token: int,
        capacity_tokens: int,
        block_size: int,
        max_num_seqs: int,
        speed: float,
        on_finished: Callable[[Request], None] | None = None,
        fp8_kv: bool = False,
        length_buckets: Sequence[float] = (),
        prefix_caching: bool = True,
    ) -> None:
        self.gpu = gpu
        self.fp8_kv = fp8_kv  # reading the pool costs the GPU's FP8 dequantization too
        self.model = model
        self.kv_bytes_per_token = kv_bytes_per_token
        self.block_size = block_size
        self.total_blocks = max(1, capacity_tokens // block_size)
        self.max_num_seqs = max_num_seqs
        self.speed = speed
        self.on_finished = on_finished
        self.stats = Stats(
            prompt_lengths=Histogram(length_buckets), output_lengths=Histogram(length_buckets)
        )
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._stopped = False
        self._dead = False
        self._halted = False  # a fault froze the engine; die() follows from another thread
        self._thread = threading.Thread(target=self._loop, name="engine-core", daemon=True)
        self._weights_bytes = model.weights_gib * GIB
        self._bandwidth = gpu.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY
        self._flops = gpu.bf16_tflops * 1e12 * PREFILL_MFU
        self._gen_window: deque[tuple[float, int]] = deque()
        self._prefill_debt = 0
        self.clock = 0.0  # engine seconds: advanced by each step's modelled duration
        # Prefix caching, counted only: hits do not shorten prefill or share blocks here
        self.prefix_caching = prefix_caching
        self._cached_blocks: OrderedDict[int, None] = OrderedDict()

    # ---- public -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self.lock:
            self._stopped = True
            self._fail_all("engine shut down")
            self._wake.notify_all()

    def die(self, reason: str) -> None:
        """Engine core died: fail everything in flight and refuse new work."""
        with self.lock:
            self._dead = True
            self._fail_all(reason)
            self._wake.notify_all()

    @property
    def dead(self) -> bool:
        return self._dead or self._halted

    def halt(self) -> None:
        """Freeze at once (call with the lock held, e.g. from on_finished): nothing more
        finishes or starts; die() then fails what is in flight."""
        self._halted = True
        self._wake.notify_all()

    def submit(self, request: Request) -> Request:
        with self.lock:
            if self._dead or self._stopped or self._halted:
                raise EngineDead("engine is not running")
            request.arrival = self.clock
            self._waiting.append(request)
            self.stats.waiting = len(self._waiting)
            self._wake.notify()
        return request

    def abort(self, request: Request, reason: str = "client disconnected") -> bool:
        """Stop a request where it is and free its KV blocks, as vLLM does when its client
        disconnects; False when it had already ended."""
        with self.lock:
            if request in self._running:
                self._running.remove(request)
            elif request in self._waiting:
                self._waiting.remove(request)
            else:
                return False
            self._finish(request, self.clock, aborted=reason)
            # the loop refreshes these only while it has work: an idle engine must read idle
            self._refresh_gauges()
            self._wake.notify()
        return True

    def usage(self) -> float:
        return self.stats.used_blocks / self.total_blocks

    def step_seconds(self, contexts: Sequence[int], prefill_tokens: int) -> float:
        """Engine time of one step: weights + KV read at memory bandwidth, plus prefill compute,
        plus the GPU's per-step, per-sequence and FP8-dequantization costs (zero unless fitted)."""
        cached = sum(contexts)
        gpu = self.gpu
        decode = (self._weights_bytes + cached * self.kv_bytes_per_token) / self._bandwidth
        overhead = gpu.step_overhead_s + len(contexts) * gpu.seq_overhead_s
        if self.fp8_kv:
            overhead += cached * gpu.fp8_dequant_s_per_token
        prefill = prefill_tokens * 2 * self.model.params_billion * 1e9 / self._flops
        return decode + overhead + prefill

    # ---- internals ----------------------------------------------------------
    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _fail_all(self, reason: str) -> None:
        for request in [*self._running, *self._waiting]:
            request.error = reason
            if request.stream is not None:
                request.stream.put(None)
            request.done.set()
        self._running.clear()
        self._waiting.clear()
        self.stats.running = self.stats.waiting = self.stats.used_blocks = (
            self.stats.used_tokens
        ) = 0

    def _admit(self, used_blocks: int) -> tuple[int, int]:
        """Move waiting requests in while their context fits; returns (blocks, prefill tokens)."""
        prefill = 0
        now = self.clock
        while self._waiting and len(self._running) < self.max_num_seqs:
            request = self._waiting[0]
            need = self._blocks(request.context + 1)
            if used_blocks + need > self.total_blocks:
                if not self._running and need > self.total_blocks:
                    # can never fit: vLLM rejects these up front; here it is aborted
                    self._waiting.popleft()
                    self._finish(request, now, aborted="request does not fit in the KV cache")
                    continue
                break
            self._waiting.popleft()
            if request.admitted is None:
                request.admitted = now
                self.stats.queue_time.observe(now - request.arrival)
                # counted once per request, as vLLM V1 does: a preempted sequence's recompute
                # is prefill work, not more prompt tokens
                self.stats.prompt_tokens += request.prompt_tokens
                self._count_prefix(request)
            self._running.append(request)
            used_blocks += need
            prefill += request.context
        return used_blocks, prefill

    def _count_prefix(self, request: Request) -> None:
        """vLLM's prefix cache counters for one admitted request: the leading blocks already
        seen are hits; then its blocks are remembered (the oldest forgotten past a bound)."""
        if not self.prefix_caching:
            return
        self.stats.prefix_queries += request.prompt_tokens
        hit = 0
        for block in request.prefix_blocks:
            if block not in self._cached_blocks:
                break
            hit += 1
        self.stats.prefix_hits += hit * self.block_size
        for block in request.prefix_blocks:
            self._cached_blocks[block] = None
            self._cached_blocks.move_to_end(block)
        while len(self._cached_blocks) > PREFIX_CACHE_BLOCKS:
            self._cached_blocks.popitem(last=False)

    def _preempt(self) -> None:
        """Free the newest sequences until the pool fits again (recompute on readmission)."""
        while self._running:
            used = sum(self._blocks(r.context) for r in self._running)
            if used <= self.total_blocks or len(self._running) == 1:
                return
            victim = self._running.pop()
            self._waiting.appendleft(victim)
            self.stats.preemptions += 1
            self.stats.last_preemptions += 1

    def _finish(self, request: Request, now: float, aborted: str | None = None) -> None:
        """`aborted`: why the request ends unfinished (counted as finished with reason abort)."""
        request.finished_at = now
        stats = self.stats
        # Both engines observe the lengths where they count the finished request (vLLM beside
        # request_success, SGLang beside num_requests_total), so aborted ones too.
        stats.prompt_lengths.observe(request.prompt_tokens)
        stats.output_lengths.observe(request.generated)
        if aborted is not None:
            stats.finished["abort"] += 1
            request.error = aborted
        else:
            stats.finished[request.finish_reason] = stats.finished.get(request.finish_reason, 0) + 1
            stats.e2e.observe(now - request.arrival)
            if request.first_token is not None and request.generated > 1:
                stats.tpot.observe((now - request.first_token) / (request.generated - 1))
        if request.stream is not None:
            request.stream.put(None)
        request.done.set()
        if request.on_done is not None:
            request.on_done(request)
        if self.on_finished is not None:
            self.on_finished(request)

    def _loop(self) -> None:
        deadline = time.monotonic()
        while True:
            with self.lock:
                while not (self._stopped or self.dead) and not (self._running or self._waiting):
                    self._wake.wait()
                    deadline = time.monotonic()
                if self._stopped or self.dead:
                    return
                tick = self._tick()
            deadline += tick
            pause = deadline - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                deadline = time.monotonic()  # fell behind (CPU starved): do not burst

    def _tick(self) -> float:
        """Run as many engine steps as fit in one tick; returns the tick's wall seconds."""
        used = sum(self._blocks(r.context) for r in self._running)
        used, prefill = self._admit(used)
        stats = self.stats
        stats.last_preemptions = 0
        prefill += self._prefill_debt  # admitted at the end of the last tick
        self._prefill_debt = 0
        contexts = [r.context for r in self._running]
        step = self.step_seconds(contexts, prefill) if self._running else 0.001
        decode_step = self.step_seconds(contexts, 0) if self._running else 0.001
        steps = max(1, math.ceil(MIN_TICK / (decode_step * self.speed)))
        if self._running:
            # stop the tick when a request finishes or the pool would overflow, so batching
            # steps never skips a finish or a preemption
            remaining = min(r.target - r.generated for r in self._running)
            headroom = self.total_blocks * self.block_size - sum(contexts)
            steps = min(steps, remaining, max(1, headroom // len(self._running)))
        wall = (step + (steps - 1) * decode_step) * self.speed
        tick_start = self.clock
        self.clock += step + (steps - 1) * decode_step
        now = self.clock
        produced = 0
        finished: list[Request] = []
        for request in self._running:
            take = min(steps, request.target - request.generated)
            if take <= 0:
                continue
            start = request.generated
            request.generated += take
            produced += take
            # token k of this tick comes out at tick_start + step + (k - 1) x decode_step
            last_token_at = tick_start + step + (take - 1) * decode_step
            if request.first_token is None:
                request.first_token = tick_start + step
                stats.ttft.observe(request.first_token - request.arrival)
                if take > 1:
                    stats.itl.observe(decode_step, take - 1)
            else:
                stats.itl.observe(decode_step, take)
            if request.stream is not None:
                for piece in request.pieces[start : request.generated]:  # one SSE event per token
                    request.stream.put(piece)
            if request.generated >= request.target:
                request.finished_at = last_token_at
                finished.append(request)
        stats.generation_tokens += produced
        # throughput over the last 5 engine seconds
        self._gen_window.append((now, produced))
        while self._gen_window and self._gen_window[0][0] < now - 5.0:
            self._gen_window.popleft()
        stats.gen_throughput = sum(n for _, n in self._gen_window) / 5.0
        for request in finished:
            if self._halted:  # a fault fired on an earlier finish of this step
                break
            self._running.remove(request)
            self._finish(request, request.finished_at or now)
        self._preempt()
        if finished and self._waiting and not self._halted:
            # refill freed slots now, so the batch never looks empty between ticks
            _, admitted = self._admit(sum(self._blocks(r.context) for r in self._running))
            self._prefill_debt += admitted
        self._refresh_gauges()
        return max(wall, 1e-4)

    def _refresh_gauges(self) -> None:
        stats = self.stats
        stats.running = len(self._running)
        stats.waiting = len(self._waiting)
        stats.used_tokens = sum(r.context for r in self._running)
        stats.used_blocks = sum(self._blocks(r.context) for r in self._running)


class SyntheticLoad:
    """Keeps `concurrency` synthetic requests in the engine, like production traffic."""

    def __init__(self, scheduler: Scheduler, spec: LoadSpec) -> None:
        self.scheduler = scheduler
        self.spec = spec
        self._pieces = [" x"] * spec.output

    def _one(self) -> Request:
        return Request(
            prompt_tokens=self.spec.prompt,
            pieces=self._pieces,
            finish_reason="length",
            on_done=self._again,
            counted=False,
        )

    def _again(self, done: Request) -> None:
        # called under the scheduler lock: append directly instead of submit()
        if done.error is None and not self.scheduler.dead:
            again = self._one()
            again.arrival = self.scheduler.clock
            self.scheduler._waiting.append(again)

    def start(self) -> None:
        for _ in range(self.spec.concurrency):
            self.scheduler.submit(self._one())
