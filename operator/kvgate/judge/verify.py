"""Production after promotion against production before it: the verify window's metric checks.

The preflight window samples every production pod (queue, TTFT histogram); each verify sample
scrapes them again. FP8 KV was adopted to shorten the queue, so a production that queues or
answers its first token clearly worse than before is a reason to revert. Counters are compared
per pod between consecutive scrapes (a pod restart resets them: that pair is skipped).

Preemptions per second are not compared: on an overloaded pool a larger KV cache admits more
requests and serves more tokens, and can preempt more often while doing so (an e2e promotion
that served its load preempted 4.7/s against a 2.3/s baseline), so the raw rate is no sign of a
regression.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvgate.records.status import PodCounters, PoolSample

# Bounds: a regression must be clear, not noise. Each is the larger of a ratio and a floor.
WAITING_RATIO, WAITING_FLOOR = 2.0, 8.0  # requests waiting
TTFT_RATIO, TTFT_FLOOR_S = 2.0, 0.25  # mean time to first token, seconds
MIN_TTFT_REQUESTS = 5  # fewer first tokens in an interval say nothing about latency


@dataclass(frozen=True, slots=True)
class Baseline:
    """The preflight window's worst figures across production pods (None: not measured)."""

    waiting: float | None = None
    ttft_s: float | None = None

    def describe(self) -> str:
        parts = []
        if self.waiting is not None:
            parts.append(f"{self.waiting:g} waiting")
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s * 1000:.0f} ms")
        return ", ".join(parts) or "none measured"


def _delta(before: float | None, after: float | None) -> float | None:
    """A counter's increase; None when unknown or reset (the pod restarted)."""
    if before is None or after is None or after < before:
        return None
    return after - before


def baseline_from_preflight(series: Mapping[str, Sequence[PoolSample]]) -> Baseline:
    """The worst queue and mean TTFT of any pod over the preflight samples."""
    waiting: list[float] = []
    ttfts: list[float] = []
    for rows in series.values():
        waiting += [s.waiting for s in rows if s.waiting is not None]
        if len(rows) < 2:
            continue
        first, last = rows[0], rows[-1]
        total = _delta(first.ttft_sum, last.ttft_sum)
        count = _delta(first.ttft_count, last.ttft_count)
        if total is not None and count and count >= MIN_TTFT_REQUESTS:
            ttfts.append(total / count)
    return Baseline(
        waiting=max(waiting) if waiting else None,
        ttft_s=max(ttfts) if ttfts else None,
    )


def regressions(
    baseline: Baseline,
    waiting: Mapping[str, float],
    before: Mapping[str, PodCounters],
    now: Mapping[str, PodCounters],
    elapsed_s: float | None,
) -> list[str]:
    """Why production is clearly worse than before the promotion (empty: it is not).

    `elapsed_s` is None on the window's first sample: counters need a previous scrape."""
    found: list[str] = []
    base = baseline.describe()
    if baseline.waiting is not None:
        bound = max(WAITING_RATIO * baseline.waiting, baseline.waiting + WAITING_FLOOR)
        worse = {pod: w for pod, w in waiting.items() if w > bound}
        if worse:
            pod, value = max(worse.items(), key=lambda kv: kv[1])
            found.append(
                f"pod {pod} has {value:g} requests waiting, above {bound:g} "
                f"(preflight baseline {base})"
            )
    if not elapsed_s or elapsed_s <= 0 or baseline.ttft_s is None:
        return found
    bound = max(TTFT_RATIO * baseline.ttft_s, baseline.ttft_s + TTFT_FLOOR_S)
    for pod in sorted(now):
        prev, cur = before.get(pod), now[pod]
        if prev is None:
            continue
        total = _delta(prev.ttft_sum, cur.ttft_sum)
        count = _delta(prev.ttft_count, cur.ttft_count)
        if total is not None and count is not None and count >= MIN_TTFT_REQUESTS:
            mean = total / count
            if mean > bound:
                found.append(
                    f"pod {pod} mean TTFT {mean * 1000:.0f} ms over {count:g} requests, above "
                    f"{bound * 1000:.0f} ms (preflight baseline {base})"
                )
    return found
