"""A revert that lands is confirmed at once, whatever the back-off (issue 25).

As an SRE's cluster does it: the promoted pods crash, an admission freeze refuses Deployment
template changes for 75 s, then lifts. The clock is the fake one of test_controller's World and
moves by exactly the delay kopf would wait, so the seconds below are the operator's schedule.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from test_controller import TERMINAL, World

from kvgate.flow import deadlines, machine, steps
from kvgate.records.status import RevertStatus
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Phase

FREEZE_S = 75.0


def test_a_revert_refused_for_75s_ends_rolled_back_within_30s_of_reading_back_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    w.kube.crash_new_pods = True  # the promoted config crashes: kvgate must revert
    frozen_since: list[dt.datetime] = []
    refused_at: list[float] = []
    applied_at: list[float] = []

    def admission(ops: list[dict[str, Any]]) -> str | None:
        if w.phase != "Reverting":
            return None
        if not frozen_since:
            frozen_since.append(w.now)
        elapsed = (w.now - frozen_since[0]).total_seconds()
        if elapsed < FREEZE_S:
            refused_at.append(elapsed)
            return "403 Forbidden: change freeze: Deployment templates are read-only"
        applied_at.append(elapsed)
        return None

    w.kube.refuse_patches = admission
    original = {k: v for k, v in w.original.items() if k in ("args", "env")}
    clean_at: float | None = None
    messages: list[str] = []
    for _ in range(500):
        delay = w.reconcile()
        status = w.obj.get("status") or {}
        if status.get("reason") == "RevertFailed":
            messages.append(status["message"])
            conditions = {c["type"]: c for c in status.get("conditions") or []}
            assert conditions["Stalled"]["status"] == "True"
            assert w.phase == "Reverting", "a refused revert must never end by itself"
        live = {k: v for k, v in w.kube.container().items() if k in ("args", "env")}
        if frozen_since and clean_at is None and live == original:
            clean_at = (w.now - frozen_since[0]).total_seconds()
        if w.phase in TERMINAL:
            break
        w.now += dt.timedelta(seconds=delay)  # exactly what kopf waits: no cap
    assert w.phase == "RolledBack", w.obj.get("status")
    w.assert_invariant()
    ended_at = (w.now - frozen_since[0]).total_seconds()
    assert clean_at is not None and applied_at and clean_at >= applied_at[0]
    # The promise: confirmed within 30 s of the Deployment reading back clean (here: one
    # reconcile, MIN_DELAY_S later).
    assert ended_at - clean_at <= 30, (clean_at, ended_at)
    # Refused attempts were retried, never more than a minute apart, and the first try after
    # the freeze came within a minute of its end.
    assert len(refused_at) >= 4
    gaps = [b - a for a, b in itertools.pairwise(refused_at)]
    assert max(gaps) <= deadlines.REVERT_BACKOFF_MAX_S + 2 * steps.MIN_DELAY_S, gaps
    assert applied_at[0] - FREEZE_S <= deadlines.REVERT_BACKOFF_MAX_S + 2 * steps.MIN_DELAY_S
    # Stalled says when the next try is.
    assert any("next try in " in m for m in messages), messages
    assert w.obj["status"]["reason"] == "PromotionReverted"


def test_the_back_off_is_capped_at_a_minute() -> None:
    assert [deadlines.revert_backoff(a) for a in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert deadlines.revert_backoff(50) == deadlines.REVERT_BACKOFF_MAX_S == 60
    assert deadlines.revert_retry_due_s(0) == 0 and deadlines.revert_retry_due_s(3) == 35


def test_a_successful_patch_is_read_back_at_once_even_late_in_the_back_off() -> None:
    """After many refusals the next try waits; the try itself is read back in seconds."""
    spec = RolloutSpec.from_dict({"targetRef": {"name": "vllm"}})
    intent = RevertStatus(Phase.ROLLED_BACK, "PromotionReverted", "crashed")
    live = steps.LiveTarget(exists=True, ours_present=True, container_found=True)
    obs = steps.Observation(live=live)
    due = deadlines.revert_retry_due_s(8)

    def step(elapsed: float) -> steps.Step:
        state = steps.State(phase=Phase.REVERTING, phase_elapsed_s=elapsed,
                              revert=intent, revert_attempts=8, revert_error="403 Forbidden")  # fmt: skip
        return machine.next_step(spec, state, obs, poll_s=5)

    waiting = step(due - 42)
    assert waiting.actions == () and waiting.requeue_s == pytest.approx(42)
    assert waiting.message.endswith("403 Forbidden; next try in 42s")
    trying = step(due)
    assert trying.actions == (steps.Action.REVERT_DEPLOYMENT,)
    assert trying.requeue_s == steps.MIN_DELAY_S  # the read-back, not the back-off
    clean = machine.next_step(
        spec,
        steps.State(
            phase=Phase.REVERTING, phase_elapsed_s=due + 1, revert=intent, revert_attempts=9
        ),
        steps.Observation(live=steps.LiveTarget(exists=True, ours_present=False)),
        poll_s=5,
    )
    assert (clean.phase, clean.reason) == (Phase.ROLLED_BACK, "PromotionReverted")
