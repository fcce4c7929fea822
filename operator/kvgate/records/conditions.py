"""Condition types, event reasons and `set_condition` with Argo Rollouts' semantics.

Conditions are observations, not the state machine (that is `status.phase`). Reasons are a
programmatic API: alert rules match them without reading messages, so each one names one fact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from kvgate.vocabulary import Condition, Phase

TRUE: Final = "True"
FALSE: Final = "False"
UNKNOWN: Final = "Unknown"

# kstatus: Ready is the summary; Reconciling and Stalled are "abnormal-true".
READY: Final = "Ready"
RECONCILING: Final = "Reconciling"
STALLED: Final = "Stalled"
# Gate observations.
POOL_PRESSURE: Final = "PoolPressure"
SCALES_PRESENT: Final = "ScalesPresent"
CANARY_HEALTHY: Final = "CanaryHealthy"
ACCURACY_NON_INFERIOR: Final = "AccuracyNonInferior"
CAPACITY_GAINED: Final = "CapacityGained"
PROMOTED: Final = "Promoted"
ROLLED_BACK: Final = "RolledBack"
STALE: Final = "Stale"  # after the verdict: what runs is not what it was reached on
DRIFTED: Final = "Drifted"  # after Promoted: the Deployment no longer carries the promoted config

ALL_TYPES: Final = (
    READY,
    RECONCILING,
    STALLED,
    POOL_PRESSURE,
    SCALES_PRESENT,
    CANARY_HEALTHY,
    ACCURACY_NON_INFERIOR,
    CAPACITY_GAINED,
    PROMOTED,
    ROLLED_BACK,
)  # Drifted is set only after Promoted, by the drift check


def get_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> tuple[Condition, ...]:
    """Return `conditions` with `type_` set.

    Like Argo's SetRolloutCondition: an unchanged status keeps its lastTransitionTime (only a
    real transition moves it); the reason, message and observedGeneration are always refreshed.
    Order is kept; a new type is appended.
    """
    if status not in (TRUE, FALSE, UNKNOWN):
        raise ValueError(f"condition status {status!r} is not True, False or Unknown")
    out: list[Condition] = []
    for cond in conditions:
        if cond.type == type_:
            moved = cond.status != status or cond.last_transition_time is None
            since = now if moved else cond.last_transition_time
            cond = Condition(type_, status, reason, message, generation, since)
        out.append(cond)
    if get_condition(conditions, type_) is None:
        out.append(Condition(type_, status, reason, message, generation, now))
    return tuple(out)


def initial_conditions(generation: int | None, now: str) -> tuple[Condition, ...]:
    """Every condition as Unknown: a controller states all its conditions on first visit."""
    false = (STALLED, PROMOTED, ROLLED_BACK)
    return tuple(
        Condition(t, TRUE, "Progressing", "", generation, now)
        if t == RECONCILING
        else Condition(t, FALSE if t in false else UNKNOWN, "NotYetObserved", "", generation, now)
        for t in ALL_TYPES
    )


def summary_conditions(
    conditions: Sequence[Condition],
    phase: Phase,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
    ready_without_terminal: bool = False,
    stalled: bool = False,
    gate_closed: bool = False,
) -> tuple[Condition, ...]:
    """Set the kstatus summary (Ready / Reconciling / Stalled) and Promoted / RolledBack for `phase`.

    Ready=True means the rollout reached a good end (Promoted, NotNeeded, or a reported verdict
    when `ready_without_terminal`); RolledBack and Failed are Ready=False with their reason, and
    so is any end of a closed gate (gate mode: NotNeeded too).
    """
    c = tuple(conditions)
    good = (
        phase in (Phase.PROMOTED, Phase.NOT_NEEDED) or ready_without_terminal
    ) and not gate_closed
    bad = phase in (Phase.ROLLED_BACK, Phase.FAILED, Phase.DECLINED) or gate_closed
    done = phase.terminal or ready_without_terminal
    stuck = stalled or phase is Phase.FAILED  # `stalled`: cannot progress by itself (RevertFailed)
    rows = [
        (READY, TRUE if good else FALSE, reason if (good or bad) else "Progressing", message),
        (RECONCILING, FALSE, reason, "")
        if done
        else (RECONCILING, TRUE, f"Phase{phase.value}", message),
        (STALLED, TRUE, reason, message) if stuck else (STALLED, FALSE, "NotStalled", ""),
    ]
    if phase is Phase.PROMOTED:
        rows.append((PROMOTED, TRUE, reason, message))
    if phase is Phase.ROLLED_BACK:
        rows.append((ROLLED_BACK, TRUE, reason, message))
    for type_, status, why, said in rows:
        c = set_condition(c, type_, status, why, said, generation=generation, now=now)
    return c
