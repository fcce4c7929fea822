"""What did a sub-8-bit candidate trade? Its verdict states both sides (issue 39 item 4).

A sub-8-bit KV format gives up accuracy on purpose (`kvgate.spec.margins`), so its verdict, whatever
it decides, says what was given up, bounded (the accuracy gate's one-sided bound against the
stated margin), and what was bought, measured (the capacity gate's KV tokens and, when the load
ran, the throughput gate's tok/s at production's load). The figures are the gates' own lines.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from kvgate.judge.gates import ACCURACY, CAPACITY_GAIN, THROUGHPUT
from kvgate.judge.verdict import Verdict, decide
from kvgate.records.status import GateResult
from kvgate.spec import margins

if TYPE_CHECKING:
    from kvgate.spec.rollout import RolloutSpec


def both_sides(results: Sequence[GateResult]) -> str:
    """The trade a sub-8-bit verdict rests on, in one line (see the module's docstring)."""
    by_gate = {r.gate: r for r in results}
    accuracy = by_gate.get(ACCURACY)
    given = accuracy.message if accuracy is not None else "not measured"
    bought = [
        f"{label}: {by_gate[gate].message}"
        for gate, label in ((CAPACITY_GAIN, "capacity"), (THROUGHPUT, "throughput"))
        if gate in by_gate
    ]
    return f"trade: accuracy given up (bounded): {given}; bought (measured): " + (
        "; ".join(bought) or "nothing measured"
    )


def judged(
    spec: RolloutSpec, results: Sequence[GateResult], *, config_hash: str, approval: str | None
) -> Verdict:
    """`verdict.decide`; a sub-8-bit candidate's verdict also states its trade, whatever it
    decides."""
    verdict = decide(results, mode=spec.promotion.mode, config_hash=config_hash, approval=approval)
    if not margins.needs_stated_margin(spec.kv_cache.policy_class):
        return verdict
    return replace(verdict, message=f"{verdict.message}; {both_sides(results)}")
