"""The reconcile is one-way: observe and act return what they found and did, `record.fold` alone
builds the new status, and the status so far is a read-only view."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest

from kvgate.controller import record
from kvgate.controller.context import StatusUpdate, StatusView
from kvgate.errors import KvgateError
from kvgate.model import Phase
from kvgate.reasons import Reason
from kvgate.steps import Step

CONTROLLER = Path(__file__).resolve().parents[2] / "operator" / "kvgate" / "controller"
MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__",
                      "__delitem__"})  # fmt: skip


def _is_status(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "status") or (
        isinstance(node, ast.Attribute) and node.attr == "status"
    )


def _reaches_status(node: ast.expr) -> bool:
    """`status`, `ctx.status`, or a block read out of it: `status["a"]["b"]`,
    `ctx.status.get("a")`, `(ctx.status.get("a") or {})`."""
    while True:
        if _is_status(node):
            return True
        if isinstance(node, ast.Subscript):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
        ):
            node = node.func.value
        elif isinstance(node, ast.BoolOp):
            node = node.values[0]
        else:
            return False


def status_writes(source: str) -> list[str]:
    """Each write into a status in `source`, as `line: code`: an assignment (plain, augmented,
    annotated) or `del` of a subscript of a status, or a mutating call on one."""
    tree = ast.parse(source)
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        found += [t for t in targets if isinstance(t, ast.Subscript) and _reaches_status(t.value)]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _reaches_status(node.func.value)
        ):
            found.append(node)
    return sorted(f"{n.lineno}: {ast.unparse(n)}" for n in found)  # type: ignore[attr-defined]


def _is_status_read(node: ast.AST) -> bool:
    """`<status>["key"]` or `<status>.get("key")`, where <status> reaches a status (or a block
    read out of one) by key: a status read as a dict instead of the typed record."""
    if isinstance(node, ast.Subscript):
        key, root = node.slice, node.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
    ):
        key, root = node.args[0], node.func.value
    else:
        return False
    return isinstance(key, ast.Constant) and isinstance(key.value, str) and _reaches_status(root)


def status_reads_by_key(source: str) -> list[str]:
    """Each line of `source` that reads a status by a string key, as `line: code` (the longest
    such read on the line)."""
    by_line: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        if _is_status_read(node):
            code = ast.unparse(node)
            line = node.lineno  # type: ignore[attr-defined]
            if len(code) > len(by_line.get(line, "")):
                by_line[line] = code
    return [f"{line}: {code}" for line, code in sorted(by_line.items())]


@pytest.mark.parametrize(
    "path",
    sorted([*CONTROLLER.glob("*.py"), *(CONTROLLER.parent / "report").glob("*.py")]),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_no_controller_or_report_module_reads_a_status_by_key(path: Path) -> None:
    # They read the typed record (`ctx.so_far`, `RolloutStatus.from_dict`). On 85d6ba1 this
    # found 122 lines in the controller (observe 36, act 26, context 22, record 22, handlers 10,
    # pullrequest 6; reads of a block copied into a local are not even counted), none in
    # the report.
    assert status_reads_by_key(path.read_text()) == []


def test_the_status_read_finder_finds_each_kind_of_read() -> None:
    source = """
a = ctx.status["phase"]
b = ctx.status.get("arms") or {}
c = (ctx.status.get("eval") or {}).get("attempt")
d = status["preflight"]["samples"]
e = dep.get("status") or {}
f = ctx.so_far.phase
g = pod["metadata"]["name"]
"""
    lines = sorted(int(r.split(":")[0]) for r in status_reads_by_key(source))
    assert lines == [2, 3, 4, 5]


@pytest.mark.parametrize(
    "module", sorted(p.name for p in CONTROLLER.glob("*.py") if p.name != "record.py")
)
def test_no_controller_module_but_record_writes_a_status(module: str) -> None:
    # On aae50ee (before observe and act returned their findings) this found 24 writes:
    # observe.py 11 (3 of them setdefault), act.py 13; handlers.py replaces its status whole.
    assert status_writes((CONTROLLER / module).read_text()) == []


def test_the_status_write_finder_finds_each_kind_of_write() -> None:
    source = """
ctx.status["a"] = 1
status["b"] += 1
ctx.status["arms"]["control"] = {}
del ctx.status["c"]
ctx.status.update(d=1)
ctx.status.setdefault("arms", {})["x"] = 1
ctx.status.pop("e", None)
(ctx.status.get("promotion") or {}).update(patched=True)
ctx.status.get("speed")["before"] = 1
x = ctx.status.get("a")
y = dict(ctx.status.get("eval") or {})
y["attempt"] = 2
status = {"phase": "Pending"}
"""
    lines = sorted(int(w.split(":")[0]) for w in status_writes(source))
    assert lines == [2, 3, 4, 5, 6, 7, 8, 9, 10]  # each write once, no read, no copy


def test_the_status_so_far_cannot_be_written() -> None:
    view = StatusView({"phase": "Canary", "arms": {"control": {"kvTokens": 10}}})
    with pytest.raises(TypeError):
        view["phase"] = "Failed"  # type: ignore[index]
    with pytest.raises(TypeError):
        del view["phase"]  # type: ignore[attr-defined]
    for name in ("update", "setdefault", "pop", "clear"):
        assert not hasattr(view, name)
    # a block read is the reader's copy: editing it changes nothing the next reader sees
    view["arms"]["control"]["kvTokens"] = 99
    assert view["arms"] == {"control": {"kvTokens": 10}}
    assert dict(view) == {"phase": "Canary", "arms": {"control": {"kvTokens": 10}}}


def test_a_view_is_its_own_copy_of_what_it_was_given() -> None:
    given = {"eval": {"attempt": 1}}
    view = StatusView(given)
    given["eval"]["attempt"] = 2
    assert view["eval"] == {"attempt": 1}


def test_updates_apply_in_order_and_leave_the_status_they_are_applied_to() -> None:
    found = {"phase": "Canary", "arms": {"control": {"scan": {}}}, "capacity": {"ratio": 2}}
    given = copy.deepcopy(found)
    block = {"attempt": 1}
    first = StatusUpdate.of(eval=block, pendingActions=["DeleteCanaries"])
    block["attempt"] = 5  # the update holds its own copy
    later = StatusUpdate.of(arms=None, capacity=None, pendingActions=None)
    applied = first.then(later).applied_to(found)
    assert found == given
    assert applied == {"phase": "Canary", "eval": {"attempt": 1}, "arms": None,
                       "capacity": None, "pendingActions": None}  # fmt: skip
    # read through a view, a removed key reads as absent-or-None, as the handlers read it
    assert (StatusView(applied).get("arms") or {}) == {}


def test_fold_applies_what_the_stages_returned_and_only_known_keys() -> None:
    found = {"phase": "Canary", "arms": {"control": {"kvTokens": 10}}, "configHash": "h1"}
    given = copy.deepcopy(found)
    step = Step(Phase.CANARY, Reason.WAITING_FOR_CANARY, "waiting for the canaries")
    args: dict[str, Any] = {"now": "2026-12-01T10:00:00Z", "generation": 1,
                            "deployment_generation": None}  # fmt: skip
    done = StatusUpdate.of(arms=None, capacity=None, configHash="h2",
                           phaseSince="2026-12-01T10:00:00Z")  # fmt: skip
    new = record.fold(found, step, Phase.CANARY, done=done, **args)
    assert found == given
    # the whole new status: a removed block is absent (the patch against `found` removes it)
    assert new["configHash"] == "h2" and "arms" not in new and "capacity" not in new
    assert new["phase"] == "Canary" and new["phaseSince"] == "2026-12-01T10:00:00Z"
    # without it, fold builds the status from what it found alone (as before)
    assert record.fold(found, step, Phase.CANARY, **args)["configHash"] == "h1"
    with pytest.raises(KvgateError, match="status has no key armz"):
        record.fold(found, step, Phase.CANARY, done=StatusUpdate.of(armz={}), **args)
