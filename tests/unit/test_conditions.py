"""set_condition keeps lastTransitionTime unless the status changes; kstatus summary per phase."""

from __future__ import annotations

import pytest

from kvgate.reasons import Reason
from kvgate.records import conditions as c
from kvgate.vocabulary import Condition, Phase

T0, T1 = "2026-11-29T10:00:00Z", "2026-11-29T10:05:00Z"


def test_new_condition_is_appended_with_transition_time() -> None:
    out = c.set_condition((), c.READY, c.FALSE, "Progressing", "m", generation=1, now=T0)
    assert out == (Condition("Ready", "False", "Progressing", "m", 1, T0),)


def test_same_status_keeps_transition_time_but_refreshes_the_rest() -> None:
    first = c.set_condition((), c.POOL_PRESSURE, c.TRUE, "PoolPressured", "a", generation=1, now=T0)
    second = c.set_condition(
        first, c.POOL_PRESSURE, c.TRUE, "PoolPressured", "b", generation=2, now=T1
    )
    assert second == (Condition("PoolPressure", "True", "PoolPressured", "b", 2, T0),)


def test_status_change_moves_transition_time() -> None:
    first = c.set_condition((), c.CANARY_HEALTHY, c.UNKNOWN, "X", "", generation=1, now=T0)
    second = c.set_condition(
        first, c.CANARY_HEALTHY, c.FALSE, "CanaryCrashed", "boom", generation=1, now=T1
    )
    assert second[0].last_transition_time == T1 and second[0].reason == "CanaryCrashed"


def test_order_is_kept() -> None:
    conds = c.initial_conditions(1, T0)
    updated = c.set_condition(
        conds, c.SCALES_PRESENT, c.FALSE, "ScalesMissing", "", generation=1, now=T1
    )
    assert [x.type for x in updated] == list(c.ALL_TYPES)


def test_bad_status_is_refused() -> None:
    with pytest.raises(ValueError, match="condition status 'yes' is not True, False or Unknown"):
        c.set_condition((), c.READY, "yes", "R", "", generation=1, now=T0)


def test_initial_conditions_state_every_type() -> None:
    conds = {x.type: x.status for x in c.initial_conditions(3, T0)}
    assert conds == {
        "Ready": "Unknown",
        "Reconciling": "True",
        "Stalled": "False",
        "PoolPressure": "Unknown",
        "ScalesPresent": "Unknown",
        "CanaryHealthy": "Unknown",
        "AccuracyNonInferior": "Unknown",
        "CapacityGained": "Unknown",
        "Promoted": "False",
        "RolledBack": "False",
    }


SUMMARY = [
    # phase, ready, reconciling, stalled, promoted, rolledBack
    (Phase.CANARY, "False", "True", "False", "False", "False"),
    (Phase.PROMOTED, "True", "False", "False", "True", "False"),
    (Phase.NOT_NEEDED, "True", "False", "False", "False", "False"),
    (Phase.ROLLED_BACK, "False", "False", "False", "False", "True"),
    (Phase.FAILED, "False", "False", "True", "False", "False"),
    (Phase.PULL_REQUEST_OPEN, "False", "True", "False", "False", "False"),
    (Phase.PULL_REQUEST_MERGED, "False", "True", "False", "False", "False"),
    (Phase.DECLINED, "False", "False", "False", "False", "False"),
]


@pytest.mark.parametrize(
    ("phase", "ready", "reconciling", "stalled", "promoted", "rolled"), SUMMARY
)
def test_summary_conditions(
    phase: Phase, ready: str, reconciling: str, stalled: str, promoted: str, rolled: str
) -> None:
    conds = c.summary_conditions(
        c.initial_conditions(1, T0), phase, "Why", "msg", generation=1, now=T1
    )
    got = {x.type: x.status for x in conds}
    assert (got["Ready"], got["Reconciling"], got["Stalled"]) == (ready, reconciling, stalled)
    assert (got["Promoted"], got["RolledBack"]) == (promoted, rolled)


def test_reported_verdict_is_ready_without_terminal_phase() -> None:
    conds = c.summary_conditions(
        (), Phase.AWAITING_APPROVAL, "VerdictReported", "m", generation=1, now=T0,
        ready_without_terminal=True,
    )  # fmt: skip
    got = {x.type: (x.status, x.reason) for x in conds}
    assert got["Ready"] == ("True", "VerdictReported")
    assert got["Reconciling"][0] == "False"


@pytest.mark.parametrize(
    ("reason", "warning"),
    [("CanaryCrashed", True), ("RolledBack", True), ("PoolHasRoom", False), ("Promoted", False),
     ("ScalesDropped", True), ("BackendChanged", True), ("CanaryCreated", False)],
)  # fmt: skip
def test_failures_are_warnings(reason: str, warning: bool) -> None:
    assert Reason(reason).warning is warning
