"""The OpenAPI v3 structural schema of a KVCacheRollout's `status`, derived from `RolloutStatus`.

One source: the CRD's status schema is `status_schema()` (`hack/gen_crd_status.py` writes it in;
a test fails when they differ). The apiserver prunes what a structural schema does not declare, so
it declares every key the typed reader reads: each field's key once, and the older spellings a
release wrote (`oldspellings`, each described with the release that removes it). Only truly open
content keeps `x-kubernetes-preserve-unknown-fields`, and each such field says why.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any, Final

from kvgate.records.codec import fields
from kvgate.records.oldspellings import COPIES, OLD_SPELLINGS, REMOVED_IN
from kvgate.records.status import ArmStatus, CapacityStatus, RolloutStatus, ScanRecord
from kvgate.vocabulary import Condition, Outcome, Phase

# Enums the CRD closes: only this operator's code writes them, and an unknown value in an enum
# makes the apiserver refuse the whole status write. Every other enum is a plain string.
CLOSED_ENUMS: Final[tuple[type[enum.Enum], ...]] = (Phase, Outcome)

PRESERVE: Final = "x-kubernetes-preserve-unknown-fields"

# What the dataclasses cannot say: formats, a condition's closed status, the list-map keys.
_EXTRA: Final[Mapping[tuple[type, str], Mapping[str, Any]]] = {
    (RolloutStatus, "observed_generation"): {"format": "int64"},
    (RolloutStatus, "run_generation"): {"format": "int64"},
    (RolloutStatus, "conditions"): {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    },
    (Condition, "status"): {"enum": ["True", "False", "Unknown"]},
    (Condition, "observed_generation"): {"format": "int64"},
    (Condition, "last_transition_time"): {"format": "date-time"},
}
_REQUIRED: Final[Mapping[type, tuple[str, ...]]] = {Condition: ("type", "status")}

_KOPF: Final = {
    "type": "object",
    "description": (
        "Open: kopf's own block (its progress when status storage is used; kvgate stores "
        "progress in annotations). Its format is kopf's, not kvgate's."
    ),
    PRESERVE: True,
}

# The sections of `oldspellings.COPIES`, by the record that holds them: per arm, beside the arm's
# own fields (`arms.<arm>`) or as an object of its own (`capacity.<arm>`).
_COPY_SECTIONS: Final[Mapping[type, str]] = {ArmStatus: "arms", CapacityStatus: "capacity"}
_ARMS: Final = ("control", "candidate")
_COPY_DOC: Final = (
    "A copy of an arm's scan figure that releases up to d77d297 wrote; read where the arm's scan "
    f"lacks it, until {REMOVED_IN}."
)


class SchemaError(TypeError):
    """A status field the schema cannot be derived for (names the field)."""


def status_schema() -> dict[str, Any]:
    """The `status` property of the CRD's openAPIV3Schema."""
    schema = _record(RolloutStatus)
    schema["properties"]["kopf"] = dict(_KOPF)
    return schema


def _description(cls: type) -> str | None:
    """A record's docstring, first paragraph, on one line (None for a dataclass without one)."""
    doc = inspect.getdoc(cls)
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature
        return None
    return " ".join(doc.split("\n\n")[0].split())


def _record(cls: type) -> dict[str, Any]:
    props: dict[str, Any] = {}
    aliases: dict[str, Any] = {}
    open_doc = None
    for f in fields(cls):
        where = f"{cls.__name__}.{f.name}"
        if f.rest:  # the record is open: `_open` refuses it without a doc saying why
            open_doc = _open(where, f.doc)["description"]
            continue
        schema = _schema(f.type, where, f.doc)
        if f.doc and "description" not in schema:
            schema = {"description": f.doc, **schema}
        schema.update(_EXTRA.get((cls, f.name), {}))
        props[f.key] = schema
        for alias in f.aliases:
            aliases.setdefault(alias, _alias(schema, f.key, _written(cls, f.name, alias)))
    section = _COPY_SECTIONS.get(cls)
    if section is not None:
        copies = _copies(section)
        if section == "arms":
            aliases.update(copies)
        else:
            block = {"type": "object", "description": _COPY_DOC, "properties": copies}
            aliases.update({arm: dict(block) for arm in _ARMS})
    props.update({k: v for k, v in aliases.items() if k not in props})
    out: dict[str, Any] = {"type": "object"}
    described = " ".join(d for d in (_description(cls), open_doc) if d)
    if described:
        out["description"] = described
    if cls in _REQUIRED:
        out["required"] = [next(f.key for f in fields(cls) if f.name == n) for n in _REQUIRED[cls]]
    out["properties"] = props
    if open_doc:
        out[PRESERVE] = True
    return out


def _copies(section: str) -> dict[str, Any]:
    """The copied figures `COPIES` reads from `section`, typed as the scan field they fill."""
    out: dict[str, Any] = {}
    for where, key, target in COPIES:
        if where == section:
            out[key] = {
                **_alias(_scan_field(target), target, ""),
                "description": f"{_COPY_DOC} (scan.{target})",
            }
    return out


def _scan_field(target: str) -> dict[str, Any]:
    """The schema of the `ScanRecord` field at the dotted key path `target`."""
    cls: Any = ScanRecord
    schema: dict[str, Any] = {}
    for part in target.split("."):
        found = next((f for f in fields(cls) if f.key == part), None)
        if found is None:
            raise SchemaError(f"oldspellings.COPIES: ScanRecord has no {target}")
        schema = _schema(found.type, f"ScanRecord.{found.name}", found.doc)
        cls = _optional_arg(found.type)
    return schema


def _written(cls: type, name: str, spelling: str) -> str:
    """Who wrote `spelling` of `cls.name`, and until when (its `oldspellings` row)."""
    row = next(
        o
        for o in OLD_SPELLINGS
        if (o.record, o.field, o.spelling) == (cls.__name__, name, spelling)
    )
    return f"written by {row.writer} until {row.last_written}"


def _alias(schema: Mapping[str, Any], key: str, written: str) -> dict[str, Any]:
    """An older spelling of `key`: its type without a closed enum (a release wrote it)."""
    out = {k: v for k, v in schema.items() if k not in ("enum", "description")}
    said = f"Old spelling of {key} ({written}); read until {REMOVED_IN}."
    if out.get(PRESERVE):  # why it is open goes with it
        said = f"{said} {schema.get('description', '')}".strip()
    return {"description": said, **out}


def _optional_arg(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _open(where: str, doc: str | None, **schema: Any) -> dict[str, Any]:
    if not doc:
        raise SchemaError(f"{where}: an open field needs a doc saying why")
    return {**schema, "description": doc, PRESERVE: True}


def _schema(tp: Any, where: str, doc: str | None) -> dict[str, Any]:
    if (inner := _optional_arg(tp)) is not tp:
        return _schema(inner, where, doc)
    origin = typing.get_origin(tp)
    if tp is Any or origin in (typing.Union, types.UnionType):
        return _open(where, doc)  # or one of several shapes: a structural schema has one type
    if origin is tuple:
        item = _schema(typing.get_args(tp)[0], where, doc)
        if item.get(PRESERVE) and "type" not in item:  # the reason is the array's, once
            item = {PRESERVE: True}
        return {"type": "array", "items": item}
    if origin is Mapping:
        value = typing.get_args(tp)[1]
        if value is Any:
            return _open(where, doc, type="object")
        return {"type": "object", "additionalProperties": _schema(value, where, doc)}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if tp in CLOSED_ENUMS:
            return {"type": "string", "enum": [m.value for m in tp]}
        return {"type": "string"}
    scalar = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(tp)
    if scalar is None:
        raise SchemaError(f"{where}: no schema for {tp!r}")
    return {"type": scalar}
