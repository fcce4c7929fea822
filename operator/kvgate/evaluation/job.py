"""The accuracy job's loop: evaluate each look's chunk on both arms, pair, decide, report.

Takes any runner with `run(arm_name, doc_ids) -> {doc_id: ArmAnswer}` (lm-eval in production,
a fake in unit tests), so the loop itself does no I/O beyond the callbacks it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial
from typing import Any, Protocol, TypeVar

from kvgate.errors import EvalError
from kvgate.evaluation.gate import (
    GatePlan,
    Verdict,
    assess_look,
    build_summary,
    progress_line,
)
from kvgate.evaluation.records import ArmAnswer, QuestionRecord, count_pairs, pair_answers
from kvgate.judge.stats import PairedCounts

T = TypeVar("T")


class ArmRunner(Protocol):
    def run(self, arm_name: str, doc_ids: Sequence[int]) -> Mapping[int, ArmAnswer]: ...


def run_gate(
    plan: GatePlan,
    runner: ArmRunner,
    *,
    task: str,
    filt: str,
    emit: Callable[[dict[str, Any]], None],
    keep: Callable[[QuestionRecord], None],
    extra: dict[str, Any] | None = None,
    parallel: bool = True,
) -> dict[str, Any]:
    """Run the planned looks until the gate decides; returns the summary (never raises EvalError).

    With `parallel`, both arms answer each chunk at the same time, so they share the same
    wall-clock conditions and the job takes half as long.
    """
    summary = partial(build_summary, plan=plan, task=task, extra=extra)
    counts = PairedCounts(0, 0, 0, 0)
    looks_taken = 0
    start = 0
    try:
        for k, end in enumerate(plan.looks):
            doc_ids = list(range(start, end))
            answers = _run_arms(runner, doc_ids, k, parallel)
            records = pair_answers(answers["control"], answers["candidate"], doc_ids, filt, k + 1)
            for record in records:
                keep(record)
            counts = counts + count_pairs(records)
            result = assess_look(plan, k, counts)
            looks_taken = k + 1
            start = end
            emit(progress_line(plan, result, counts))
            if result.verdict is not None:
                return summary(
                    verdict=result.verdict,
                    counts=counts,
                    looks_taken=looks_taken,
                    reason=result.reason,
                )
    except EvalError as exc:
        return summary(
            verdict=Verdict.ERROR,
            counts=counts if counts.n else None,
            looks_taken=looks_taken,
            error=str(exc),
        )
    raise AssertionError("the last look always decides")  # pragma: no cover


def _run_arms(
    runner: ArmRunner, doc_ids: list[int], look: int, parallel: bool
) -> dict[str, Mapping[int, ArmAnswer]]:
    # Alternate which arm starts so neither always meets a warmer server.
    order = ("control", "candidate") if look % 2 == 0 else ("candidate", "control")
    if not parallel:
        return {name: runner.run(name, doc_ids) for name in order}
    return on_both_arms(lambda name: runner.run(name, doc_ids), order, "kvgate-arm")


def on_both_arms(run: Callable[[str], T], names: Iterable[str], prefix: str) -> dict[str, T]:
    """`run` on each arm at once, its results by arm in the order of `names`."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix=prefix) as pool:
        futures = {name: pool.submit(run, name) for name in names}
        # Wait for both before raising, so no request is still in flight when the job ends.
        wait(futures.values())
        return {name: future.result() for name, future in futures.items()}
