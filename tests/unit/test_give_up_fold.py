"""Giving up after errors keeps what went through: `act.act_best_effort` returns the stages' fold
so far and the status and Events of the actions before a failing one (a failing API mid-step
must not erase the write-ahead records of what was already done)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from kvgate.controller import act
from kvgate.controller.changes import StatusUpdate
from kvgate.errors import ExternalError
from kvgate.flow.steps import Action, Step
from kvgate.reasons import Reason
from kvgate.records.status import RolloutStatus
from kvgate.vocabulary import Phase

LOG = logging.getLogger("test")


@dataclasses.dataclass
class _Ctx:
    so_far: RolloutStatus
    logger: logging.Logger = LOG

    def seeing(self, update: StatusUpdate) -> _Ctx:
        return dataclasses.replace(self, so_far=update.applied_to(self.so_far))


def test_a_failing_action_keeps_the_fold_and_the_actions_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []

    def snapshot(ctx: Any, step: Step) -> StatusUpdate:
        seen.append(ctx.so_far.message)  # sees what the stages did before it
        return StatusUpdate.of(progress="snapshot taken").then(
            StatusUpdate.event(Reason.RECONCILE_ERROR, "snapshot", warning=False)
        )

    def create_eval_job(ctx: Any, step: Step) -> StatusUpdate:
        raise ExternalError("apiserver gone mid-step")

    monkeypatch.setitem(act.ACTIONS, Action.SNAPSHOT_SPEED, snapshot)
    monkeypatch.setitem(act.ACTIONS, Action.CREATE_EVAL_JOB, create_eval_job)
    step = Step(Phase.ROLLED_BACK, Reason.RECONCILE_ERROR, "giving up",
                actions=(Action.SNAPSHOT_SPEED, Action.CREATE_EVAL_JOB, Action.DELETE_CANARIES))  # fmt: skip
    before = StatusUpdate.of(message="found by observe")

    done = act.act_best_effort(_Ctx(RolloutStatus()), step, before)  # type: ignore[arg-type]

    assert seen == ["found by observe"]
    assert done.fields == {"message": "found by observe", "progress": "snapshot taken"}
    assert [e.message for e in done.events] == ["snapshot"]
    # the deletion after the failure was not recorded as done
    assert "pending_actions" not in done.fields
