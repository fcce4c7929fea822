"""kvgate run: the process ends with kopf's clean stop, not with interpreter finalization."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate import cli
from kvgate.commands import run as run_command


class Exited(BaseException):  # cli.main turns an Exception into exit 70
    pass


def test_a_leader_leaves_with_exit_0_without_finalizing(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    calls: list[str] = []
    monkeypatch.setattr(run_command, "_lead", lambda args, ns: calls.append("lead"))
    monkeypatch.setattr(kopf, "run", lambda **kw: calls.append("kopf"))

    def fake_exit(code: int) -> None:
        calls.append(f"exit {code}")
        raise Exited

    monkeypatch.setattr(run_command.os, "_exit", fake_exit)
    with pytest.raises(Exited):
        cli.main(["run", "-A"])
    # kopf stopped cleanly first; then the process leaves at once with 0 (the Lease thread is
    # never left to race interpreter shutdown)
    assert calls == ["lead", "kopf", "exit 0"]


def test_without_leader_election_run_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    monkeypatch.setattr(run_command.os, "_exit", lambda code: pytest.fail("os._exit called"))
    assert cli.main(["run", "-A", "--no-leader-elect"]) == 0
    assert seen["clusterwide"] is True and seen["standalone"] is True
