"""The CRD's status schema is the one `kvgate.records.schema` derives from `RolloutStatus`, and the
apiserver's pruning of it loses nothing the operator writes (checked here by a pruner that walks the
schema as the apiserver does; tests/e2e/test_crd.py checks the real one).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import enum
import functools
import json
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from test_fuzz_parsers import FUZZ as PROPERTY
from test_status import _applied, fake_cluster_statuses, status_shaped

import gen_crd_status
from kvgate.records.codec import fields, write
from kvgate.records.oldspellings import COPIES, OLD_SPELLINGS
from kvgate.records.schema import PRESERVE, SchemaError, status_schema
from kvgate.records.status import EvalProgress, RolloutStatus
from kvgate.vocabulary import Outcome, Phase

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "kvgate.io_kvcacherollouts.yaml"
CONTROLLER = ROOT / "operator" / "kvgate" / "controller"


@functools.cache
def _version() -> dict[str, Any]:
    """The CRD's one version, read once (the tests only read it)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    (version,) = yaml.load(CRD.read_text(), Loader=loader)["spec"]["versions"]
    return dict(version)


def _crd_status() -> dict[str, Any]:
    return dict(_version()["schema"]["openAPIV3Schema"]["properties"]["status"])


# --- what the apiserver does with a structural schema ----------------------------------------------


def prune(schema: Mapping[str, Any], value: Any) -> Any:
    """`value` as the apiserver stores it: keys the schema does not declare are dropped, unless
    the node preserves unknown fields (whose undeclared content is then kept as it is)."""
    if isinstance(value, Mapping):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for k, v in value.items():
            if props is not None and k in props:
                out[k] = prune(props[k], v)
            elif isinstance(extra, Mapping):
                out[k] = prune(extra, v)
            elif schema.get(PRESERVE):
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(value, list):
        items = schema.get("items")
        if not isinstance(items, Mapping):
            return copy.deepcopy(value) if schema.get(PRESERVE) else []
        return [prune(items, v) for v in value]
    return value


_TYPES: dict[str, Any] = {
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": int | float,
    "object": Mapping,
    "array": list,
}


def refusals(schema: Mapping[str, Any], value: Any, path: str = "status") -> list[str]:
    """Why the apiserver would refuse `value` (type, enum, required): [] when it takes it."""
    tp = schema.get("type")
    if tp is not None:
        numeric = tp in ("integer", "number")
        if not isinstance(value, _TYPES[tp]) or (numeric and isinstance(value, bool)):
            return [f"{path}: {value!r} is not {tp}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} is not one of {schema['enum']}"]
    out = []
    if isinstance(value, Mapping):
        out += [f"{path}.{k}: required" for k in schema.get("required", ()) if k not in value]
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k, extra if isinstance(extra, Mapping) else None)
            if sub is not None:
                out += refusals(sub, v, f"{path}.{k}")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, v in enumerate(value):
            out += refusals(schema["items"], v, f"{path}[{i}]")
    return out


def assert_kept(raw: Mapping[str, Any]) -> None:
    """The status survives the apiserver whole: nothing pruned, nothing refused."""
    stored = _applied(raw)  # what a merge patch leaves: no nulls
    schema = _crd_status()
    assert refusals(schema, stored) == []
    pruned = prune(schema, stored)
    assert pruned == stored, _first_difference(stored, pruned)


def _first_difference(want: Any, got: Any, path: str = "status") -> str:
    if isinstance(want, Mapping) and isinstance(got, Mapping):
        for k in want:
            if k not in got:
                return f"{path}.{k} is pruned"
            if want[k] != got[k]:
                return _first_difference(want[k], got[k], f"{path}.{k}")
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path}: {want!r} became {got!r}"


# --- the pruner and the refusals themselves --------------------------------------------------------


def test_the_pruner_drops_what_the_schema_does_not_declare() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "open": {"type": "object", PRESERVE: True, "properties": {"n": {"type": "integer"}}},
            "m": {"type": "object", "additionalProperties": {"type": "object", "properties": {}}},
            "l": {"type": "array", "items": {"type": "object", "properties": {"x": {}}}},
        },
    }
    value = {"a": {"b": 1, "c": 2}, "open": {"n": 1, "deep": {"z": [1]}}, "gone": 1,
             "m": {"k": {"y": 1}}, "l": [{"x": 1, "y": 2}]}  # fmt: skip
    assert prune(schema, value) == {"a": {"b": 1}, "open": {"n": 1, "deep": {"z": [1]}},
                                    "m": {"k": {}}, "l": [{"x": 1}]}  # fmt: skip
    with pytest.raises(AssertionError, match=r"status\.arms\.control\.newFigure is pruned"):
        assert_kept({"phase": "Canary", "arms": {"control": {"pod": "p", "newFigure": 1}}})


@pytest.mark.parametrize(
    ("raw", "refused"),
    [({"phase": "Nope"}, "status.phase: 'Nope' is not one of"),
     ({"port": "8000"}, "status.port: '8000' is not integer"),
     ({"port": True}, "status.port: True is not integer"),
     ({"capacity": {"ratio": False}}, "status.capacity.ratio: False is not number"),
     ({"gates": {"pool": {"outcome": "pass"}}}, "status.gates.pool.outcome: 'pass' is not one of"),
     ({"conditions": [{"type": "Ready"}]}, "status.conditions[0].status: required")],
)  # fmt: skip
def test_what_the_apiserver_would_refuse_is_named(raw: dict[str, Any], refused: str) -> None:
    (why,) = refusals(_crd_status(), raw)
    assert why.startswith(refused)


# --- one source --------------------------------------------------------------------------------------


def test_the_crd_status_schema_is_the_generated_one() -> None:
    # Run `make crd-status` (hack/gen_crd_status.py) after changing kvgate/records/status.py.
    assert _crd_status() == status_schema()
    assert gen_crd_status.render(CRD.read_text()) == CRD.read_text()


def test_the_generator_rewrites_only_the_status_block() -> None:
    text = CRD.read_text()
    stale = text.replace("                reason: {type: string}\n", "", 1)
    assert stale != text and gen_crd_status.render(stale) == text
    spec_before = text.split("            status:\n")[0]
    assert gen_crd_status.render(stale).startswith(spec_before)
    assert gen_crd_status.main(["--check", str(CRD)]) == 0


def test_a_stale_crd_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crd = tmp_path / "crd.yaml"
    crd.write_text(CRD.read_text().replace("servedModel: {type: string}", "servedModel: {}"))
    assert gen_crd_status.main(["--check", str(crd)]) == 1
    assert "status schema is stale; run make crd-status" in capsys.readouterr().err
    assert gen_crd_status.main([str(crd)]) == 0 and crd.read_text() == CRD.read_text()


def test_enums_are_closed_only_where_this_operator_is_the_only_writer() -> None:
    found: dict[str, list[str]] = {}

    def walk(node: Mapping[str, Any], path: str) -> None:
        if "enum" in node:
            found[path] = node["enum"]
        for k, v in (node.get("properties") or {}).items():
            walk(v, f"{path}.{k}")
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), Mapping):
                walk(node[key], f"{path}.*")

    walk(status_schema(), "status")
    phases, outcomes = [p.value for p in Phase], [o.value for o in Outcome]
    assert found == {
        "status.phase": phases,
        "status.revert.phase": phases,
        "status.gates.*.outcome": outcomes,
        "status.verdict.outcome": outcomes,
        "status.conditions.*.status": ["True", "False", "Unknown"],
    }  # reasons, verdicts and the eval Job's words stay plain strings: read tolerant


def test_every_open_field_says_why() -> None:
    opened: list[str] = []

    def walk(node: Mapping[str, Any], path: str) -> None:
        if node.get(PRESERVE):
            opened.append(path)
            assert "Open:" in node.get("description", ""), path
        for k, v in (node.get("properties") or {}).items():
            walk(v, f"{path}.{k}")
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), Mapping):
                sub = node[key]
                if key == "items" and sub.get(PRESERVE) and "type" not in sub:
                    assert "Open:" in node.get("description", ""), path  # said on the array
                    opened.append(f"{path}[]")
                    continue
                walk(sub, f"{path}.*")

    walk(status_schema(), "status")
    # The typed blocks that were wholly open before (arms, preflight, speed, promotion,...) are
    # not; what is left is another program's format (the eval Job, SGLang, kopf, Kubernetes).
    for typed in ("arms", "preflight", "speed", "promotion", "remediation", "gates", "verdict",
                  "capacity", "eval", "recommendedEnv"):  # fmt: skip
        assert f"status.{typed}" not in opened
    assert "status.kopf" in opened and "status.previous" in opened


def test_an_open_field_without_a_reason_is_refused() -> None:
    from dataclasses import dataclass

    from kvgate.records import schema as statusschema
    from kvgate.records.codec import key

    @dataclass(frozen=True)
    class Loose:
        blob: Mapping[str, Any] = key(default={})

    with pytest.raises(SchemaError, match=r"Loose\.blob: an open field needs a doc saying why"):
        statusschema._record(Loose)


def _resolve(schema: Mapping[str, Any], json_path: str) -> Mapping[str, Any] | None:
    """The schema node a printer column's JSONPath reads (filters step into the items)."""
    node: Mapping[str, Any] | None = schema
    for part in re.findall(r"\.(\w+)|\[\?[^]]*\]", json_path):
        if node is None:
            return None
        if not part:  # a filter: one of the array's items
            node = node.get("items") if node.get("type") == "array" else None
        else:
            node = (node.get("properties") or {}).get(part)
    return node


@pytest.mark.parametrize("column", _version()["additionalPrinterColumns"], ids=lambda c: c["name"])
def test_every_printer_column_reads_a_field_the_schema_declares(column: dict[str, Any]) -> None:
    root = _version()["schema"]["openAPIV3Schema"]
    if column["jsonPath"].startswith(".metadata."):
        return  # the apiserver's own object metadata
    node = _resolve(root, column["jsonPath"])
    assert node is not None, f"{column['name']}: {column['jsonPath']} is not in the schema"
    want = {"string": "string", "number": "number", "integer": "integer", "date": "string"}
    assert node["type"] == want[column["type"]], column["name"]


def test_the_column_resolver_fails_on_a_missing_path() -> None:
    root = _version()["schema"]["openAPIV3Schema"]
    assert _resolve(root, ".status.accuracy.differencePpX") is None
    assert _resolve(root, ".status.conditions[?(@.type=='Ready')].status") == {
        "type": "string", "enum": ["True", "False", "Unknown"]
    }  # fmt: skip


# --- nothing the operator writes is pruned ---------------------------------------------------------


def test_every_status_the_fake_cluster_controller_writes_survives_pruning() -> None:
    seen = fake_cluster_statuses()
    assert len(seen) > 250
    for raw in seen:
        assert_kept(raw)


def _full(tp: Any, spelling: int) -> Any:
    """A value of `tp` with every field set, each under its `spelling`-th name (0: the key, then
    the older spellings the reader accepts; the last one a field has when it has fewer)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _full(next(a for a in typing.get_args(tp) if a is not type(None)), spelling)
    if origin is tuple:
        return [_full(typing.get_args(tp)[0], spelling)]
    if origin is Mapping:
        return {"control": _full(typing.get_args(tp)[1], spelling)}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        out: dict[str, Any] = {}
        for f in fields(tp):
            if f.rest:
                out["jobNote"] = {"sided": "one-sided"}
                continue
            names = (f.key, *f.aliases)
            out[names[min(spelling, len(names) - 1)]] = _full(f.type, spelling)
        return out
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp)).value
    samples = {bool: True, int: 3, float: 0.25, str: "s", Any: {"open": [1, {"a": None}]}}
    return samples[tp]


def test_every_field_under_every_spelling_survives_pruning() -> None:
    most = max(len(f.aliases) for cls in _records(RolloutStatus) for f in fields(cls))
    for spelling in range(most + 1):
        raw = _full(RolloutStatus, spelling)
        stored = prune(_crd_status(), raw)
        assert stored == raw, (spelling, _first_difference(raw, stored))
    # and the copies of an arm's figures earlier releases wrote, which the reader still reads
    for section, k, _ in COPIES:
        raw = {section: {"candidate": {k: 1}}}
        assert prune(_crd_status(), raw) == raw


def _property_names(schema: Mapping[str, Any]) -> set[str]:
    """Every property name declared anywhere under `schema`."""
    names: set[str] = set()
    for name, sub in (schema.get("properties") or {}).items():
        names |= {name, *_property_names(sub)}
    for nested in ("items", "additionalProperties"):
        if isinstance(schema.get(nested), Mapping):
            names |= _property_names(schema[nested])
    return names


def test_the_crd_declares_no_spelling_that_no_release_wrote() -> None:
    """Each status field once, by its key; another spelling only where `oldspellings` lists
    what wrote it (issue 38: the report's guesses and never-written snake_case are gone)."""
    declared = _property_names(_crd_status())
    records = _records(RolloutStatus)
    keys = {f.key for cls in records for f in fields(cls)}
    in_schema = {r.__name__ for r in records}  # eval.progress is open: EvalProgress is not
    written = {o.spelling for o in OLD_SPELLINGS if o.record in in_schema}
    written |= {k for _, k, _ in COPIES}
    assert declared - keys - {"kopf"} == written - keys
    never_written = {"config_hash", "recommended_args", "observed_generation", "kvDtype",
                     "kvCacheTokens", "tokens", "backend", "gain", "kvTokensRatio", "wilson",
                     "interval", "ci95", "sm_mhz", "result"}  # fmt: skip
    assert not declared & never_written
    assert "findings" not in _crd_status()["properties"]  # status.findings: nobody wrote it
    for row in OLD_SPELLINGS:  # a row names a field that exists, and says what wrote it
        record = next(c for c in records | {EvalProgress} if c.__name__ == row.record)
        assert row.spelling in {a for f in fields(record) if f.name == row.field for a in f.aliases}
        assert row.writer and row.last_written


def _records(tp: Any) -> set[type]:
    """`tp` and every record type under it."""
    found: set[type] = set()
    todo = [tp]
    while todo:
        t = todo.pop()
        if typing.get_origin(t) is not None:
            todo.extend(typing.get_args(t))
        elif isinstance(t, type) and dataclasses.is_dataclass(t) and t not in found:
            found.add(t)
            todo.extend(f.type for f in fields(t))
    return found


@settings(parent=PROPERTY, max_examples=25)  # the field-by-field test above covers every key
@given(status_shaped)
def test_any_typed_status_survives_pruning(raw: Any) -> None:
    written = RolloutStatus.from_dict(raw).to_dict()
    stored = prune(_crd_status(), written)
    assert stored == written, _first_difference(written, stored)


def _status_keys_written(tree: ast.Module) -> set[str]:
    """Top-level status keys a controller module writes by name: `<x>.status["k"] = ...`,
    `status["k"] = ...`, `<x>.status.update(k=...)`, `status.update(k=...)`,
    `<x>.status.setdefault("k", ...)`, and the keys observe and act return for status:
    `StatusUpdate.of(field=...)`."""

    def is_status(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "status") or (
            isinstance(node, ast.Attribute) and node.attr == "status"
        )

    # names bound to `StatusFields()`: `fields["accuracy"] = ...` writes the field's key
    typed_fields = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "StatusFields"
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    keys: set[str] = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            if (
                isinstance(t, ast.Subscript)
                and isinstance(t.slice, ast.Constant)
                and isinstance(t.slice.value, str)
            ):
                if is_status(t.value):
                    keys.add(t.slice.value)
                elif isinstance(t.value, ast.Name) and t.value.id in typed_fields:
                    keys.add(by_field[t.slice.value])
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("update", "setdefault")
            and is_status(node.func.value)
        ):
            keys.update(k.arg for k in node.keywords if k.arg)
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                keys.add(first.value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "of"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "StatusUpdate"
        ):
            keys.update(by_field[k.arg] for k in node.keywords if k.arg)
        # typed: `dataclasses.replace(status, field=...)` and `RolloutStatus(field=...)` write the
        # field's key (mypy checks the field exists; this checks the key is in the schema)
        replaced = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "replace"
            and bool(node.args)
            and is_status(node.args[0])
        )
        built = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "RolloutStatus"
        )
        if replaced or built:
            keys.update(by_field[k.arg] for k in node.keywords if k.arg)
    return keys


by_field = {f.name: f.key for f in fields(RolloutStatus)}


def test_every_status_key_the_controller_writes_by_name_is_in_the_schema() -> None:
    declared = set(status_schema()["properties"])
    written: dict[str, set[str]] = {
        path.name: _status_keys_written(ast.parse(path.read_text()))
        for path in sorted(CONTROLLER.glob("*.py"))
    }
    every = set().union(*written.values())
    assert {"pendingActions", "eval", "speed", "remediation", "configHash", "phaseSince",
            "preflight", "capacity", "accuracy", "progress", "verdict", "finishedAt"} <= every  # fmt: skip
    undeclared = {m: keys - declared for m, keys in written.items() if keys - declared}
    assert undeclared == {}
    # the dataclass declares each of them, not only the schema
    assert every <= {f.key for f in fields(RolloutStatus)}


def test_the_crd_still_fits_a_client_side_apply() -> None:
    # `kubectl apply -f charts/kvgate/crds/` (the chart README) keeps the whole object in the
    # last-applied annotation, and the apiserver refuses annotations over 256 KiB in total.
    crd = yaml.safe_load(CRD.read_text())
    assert len(json.dumps(crd, separators=(",", ":"))) < 200_000


def test_every_startup_log_scan_the_controller_stores_survives_pruning() -> None:
    # The scan is stored as logs.LogScan.status_record() gives it (status.ScanRecord, camelCase):
    # the largest block the controller writes. Every sample and field log, either engine.
    from kvgate.controller.sources import scan_engine_log

    data = ROOT / "tests" / "data"
    logs = sorted((data / "logs").glob("*.txt")) + sorted((data / "field-logs").glob("*.log"))
    assert len(logs) > 40
    for path in logs:
        engine = "sglang" if path.name.startswith("sglang") else "vllm"
        scan = write(scan_engine_log(path.read_text(encoding="utf-8", errors="replace"), engine))
        assert scan.get("engine"), path.name
        assert_kept({"arms": {"candidate": {"scan": scan}}})
