"""The reconcile is one-way: observe and act return what they found and did, `record.folded`
alone builds the new status, and the status so far is a frozen record."""

from __future__ import annotations

import ast
import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from kvgate.controller import record
from kvgate.controller.changes import StatusFields, StatusUpdate
from kvgate.flow.steps import Step
from kvgate.reasons import Reason
from kvgate.records.status import EvalStatus, RolloutStatus
from kvgate.vocabulary import Phase

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


def _records(cls: type, seen: set[type] | None = None) -> set[type]:
    """`cls` and every status record reachable from its fields."""
    seen = set() if seen is None else seen
    if cls in seen or not dataclasses.is_dataclass(cls):
        return seen
    seen.add(cls)
    for hint in typing.get_type_hints(cls).values():
        for arg in (hint, *_args(hint)):
            if isinstance(arg, type):
                _records(arg, seen)
    return seen


def _args(hint: Any) -> tuple[Any, ...]:
    out: tuple[Any, ...] = ()
    for arg in typing.get_args(hint):
        out += (arg, *_args(arg))
    return out


def test_the_status_so_far_cannot_be_written() -> None:
    status = RolloutStatus.from_dict({"phase": "Canary", "arms": {"control": {"pod": "p"}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.phase = Phase.FAILED  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.arms["control"].pod = "q"  # type: ignore[misc]
    # Every record is frozen and every collection in it is typed read-only (tuple, Mapping),
    # so mypy refuses a write into a block a stage reads (`status.arms["x"] = ...`).
    records = _records(RolloutStatus)
    assert len(records) > 30
    for record_type in records:
        assert record_type.__dataclass_params__.frozen, record_type  # type: ignore[attr-defined]
        for name, hint in typing.get_type_hints(record_type).items():
            mutable = {typing.get_origin(a) or a for a in (hint, *_args(hint))} & {dict, list, set}
            assert not mutable, f"{record_type.__name__}.{name}: {hint}"


def test_the_status_so_far_is_its_own_copy_of_what_it_was_given() -> None:
    given = {"eval": {"attempt": 1}}
    status = RolloutStatus.from_dict(given)
    given["eval"]["attempt"] = 2
    assert status.eval is not None and status.eval.attempt == 1


def test_updates_apply_in_order_and_leave_the_status_they_are_applied_to() -> None:
    raw = {"phase": "Canary", "arms": {"control": {"pod": "p"}}, "capacity": {"ratio": 2}}
    found = RolloutStatus.from_dict(raw)
    given = RolloutStatus.from_dict(copy.deepcopy(raw))
    first = StatusUpdate.of(eval=EvalStatus(attempt=1), pending_actions=("DeleteCanaries",))
    first = first.then(StatusUpdate.event(Reason.EVAL_STARTED, "eval attempt 1"))
    later = StatusUpdate.of(arms={}, capacity=None, pending_actions=())
    later = later.then(StatusUpdate.event(Reason.PROMOTING, "patched"))
    both = first.then(later)
    applied = both.applied_to(found)
    assert found == given
    assert applied.to_dict() == {"phase": "Canary", "eval": {"attempt": 1}}
    assert (applied.arms, applied.capacity, applied.pending_actions) == ({}, None, ())
    assert [e.reason for e in both.events] == [Reason.EVAL_STARTED, Reason.PROMOTING]


def test_a_status_update_names_the_fields_of_the_status() -> None:
    # mypy checks `StatusUpdate.of(...)` against StatusFields: the two must say the same
    fields = typing.get_type_hints(StatusFields)
    assert fields == typing.get_type_hints(RolloutStatus)


def test_fold_applies_what_the_stages_returned_and_only_known_fields() -> None:
    raw = {"phase": "Canary", "arms": {"control": {"pod": "p"}}, "configHash": "h1"}
    found = RolloutStatus.from_dict(raw)
    given = RolloutStatus.from_dict(copy.deepcopy(raw))
    step = Step(Phase.CANARY, Reason.WAITING_FOR_CANARY, "waiting for the canaries")
    args: dict[str, Any] = {"now": "2026-12-01T10:00:00Z", "generation": 1,
                            "deployment_generation": None}  # fmt: skip
    done = StatusUpdate.of(arms={}, capacity=None, config_hash="h2",
                           phase_since="2026-12-01T10:00:00Z")  # fmt: skip
    new = record.folded(found, step, Phase.CANARY, done=done, **args).to_dict()
    assert found == given
    # the whole new status: a removed block is absent (the patch against `found` removes it)
    assert new["configHash"] == "h2" and "arms" not in new and "capacity" not in new
    assert new["phase"] == "Canary" and new["phaseSince"] == "2026-12-01T10:00:00Z"
    # without it, fold builds the status from what it found alone (as before)
    assert record.folded(found, step, Phase.CANARY, **args).to_dict()["configHash"] == "h1"
    with pytest.raises(TypeError, match="armz"):  # and mypy refuses it before it runs
        record.folded(found, step, Phase.CANARY, done=StatusUpdate.of(armz={}), **args)  # type: ignore[call-arg]


def _calls(path: Path, name: str) -> list[str]:
    """Each call of `name` (a function or `module.function`) in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func == name or func.endswith(f".{name}"):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_events_are_posted_from_one_module() -> None:
    # On 94fe2f3 they were posted from act (3), handlers (4), pullrequest (3) and record (2);
    # now the stages return theirs in their StatusUpdate and `record` posts them all.
    package = sorted(CONTROLLER.parent.rglob("*.py"))
    kopf_events = [c for p in package for c in _calls(p, "kopf.event")]
    assert [c.split(":")[0] for c in kopf_events] == ["events.py"]
    posts = [c for p in package for c in _calls(p, "post_event")]
    assert posts and {c.split(":")[0] for c in posts} == {"record.py"}
