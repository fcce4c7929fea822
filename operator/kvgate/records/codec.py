"""How does a frozen dataclass read from, and write to, camelCase JSON? The codec of the status.

Reading is total: a value of the wrong type reads as MISSING (the field stays unknown), never as a
guess, and open JSON deeper than `MAX_DEPTH` is cut. Writing leaves nulls and empty collections out.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvgate.records.oldspellings import spellings_of
from kvgate.vocabulary import Condition

MAX_DEPTH: Final = 64  # open JSON deeper than this is cut (a hostile status cannot recurse us)


def key(
    key: str | None = None,
    *,
    default: Any = None,
    rest: bool = False,
    doc: str | None = None,
    named: bool = False,
) -> Any:
    """A field's status key (camelCase of its name unless given; older spellings: `oldspellings`).

    `rest`: the field keeps the keys no other field reads (evidence another program wrote, such
    as the eval Job's summary), written back beside them. `doc`: its description in the CRD's
    schema (`schema`); an open field must say why. `named`: the field is the record's key in the
    mapping holding it (a gate's name in `gates`), filled from that key on reading, not written.
    """
    meta = {"key": key, "rest": rest, "doc": doc, "named": named}
    if isinstance(default, dict | tuple) and default == type(default)():
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


MISSING: Final = object()


def whole(value: Any) -> Any:
    """13.0 -> 13, as the apiserver stores it, so status round-trips unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def record_of(cls: type[Any], source: object, **given: Any) -> Any:
    """A status record `cls` filled from `source`'s attributes of the same names (a result
    type beside its status record), `given` for the fields that differ. A field neither has
    raises AttributeError: a rename on one side must not silently empty the record."""
    names = (f.name for f in dataclasses.fields(cls) if f.name not in given)
    return cls(**{n: getattr(source, n) for n in names}, **given)


def read_record(cls: type[Any], raw: object) -> Any:
    """`raw` read as the record `cls` (total: anything unreadable reads as `cls()`)."""
    value = read(cls, raw, 0)
    return cls() if value is MISSING else value


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    key: str
    aliases: tuple[str, ...]
    type: Any
    rest: bool
    doc: str | None = None


@functools.cache
def fields(cls: type) -> tuple[_Field, ...]:
    """Each field of a status record: its key, its older spellings (`oldspellings`), its type."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("named"):
            continue
        key = f.metadata.get("key") or camel(f.name)
        aliases = tuple(a for a in spellings_of(cls.__name__, f.name) if a != key)
        rest, doc = bool(f.metadata.get("rest")), f.metadata.get("doc")
        out.append(_Field(f.name, key, aliases, hints[f.name], rest, doc))
    return tuple(out)


@functools.cache
def _known_keys(cls: type) -> frozenset[str]:
    return frozenset(k for f in fields(cls) if not f.rest for k in (f.key, *f.aliases))


def _named(tp: Any) -> str | None:
    """The field of record type `tp` its mapping's key fills (`key(named=True)`), if any."""
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return None
    return next((f.name for f in dataclasses.fields(tp) if f.metadata.get("named")), None)


def read(tp: Any, raw: object, depth: int) -> Any:
    if depth > MAX_DEPTH:
        return MISSING
    origin = typing.get_origin(tp)
    if tp is Any:
        return _json(raw, depth)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is not type(None) and (value := read(arg, raw, depth)) is not MISSING:
                return value
        return MISSING
    if origin is tuple:
        if not isinstance(raw, list | tuple):
            return MISSING
        item = typing.get_args(tp)[0]
        return tuple(v for v in (read(item, r, depth + 1) for r in raw) if v is not MISSING)
    if origin is Mapping:
        if not isinstance(raw, Mapping):
            return MISSING
        item = typing.get_args(tp)[1]
        pairs = ((k, read(item, v, depth + 1)) for k, v in raw.items() if isinstance(k, str))
        name = _named(item)
        if name is None:
            return {k: v for k, v in pairs if v is not MISSING}
        return {k: dataclasses.replace(v, **{name: k}) for k, v in pairs if v is not MISSING}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(raw, Mapping):
            return MISSING
        values: dict[str, Any] = {}
        for f in fields(tp):
            if f.rest:
                known = _known_keys(tp)  # _json drops the keys that are not str
                rest = {k: v for k, v in raw.items() if k not in known and v is not None}
                values[f.name] = _json(rest, depth + 1)
                continue
            for k in (f.key, *f.aliases):
                if k in raw and (value := read(f.type, raw[k], depth + 1)) is not MISSING:
                    values[f.name] = value
                    break
        if tp is Condition:  # its type, status and reason are required
            values = {"type": "", "status": "Unknown", "reason": "", **values}
        return tp(**values)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(raw) if isinstance(raw, str) else MISSING
        except ValueError:
            return MISSING
    if tp is bool or tp is str:
        return raw if isinstance(raw, tp) else MISSING
    if tp is int:
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else MISSING
    if tp is float:  # an int stays an int (200 counts are not 200.0 in the patch)
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            return MISSING
        return raw if isinstance(raw, int) or math.isfinite(raw) else MISSING
    return MISSING


def _json(raw: object, depth: int) -> Any:
    """A JSON value kept as it is; what JSON cannot say (NaN, non-str keys, objects) is dropped."""
    if depth > MAX_DEPTH:
        return MISSING
    if raw is None or isinstance(raw, str | bool | int):
        return raw
    if isinstance(raw, float):
        return raw if math.isfinite(raw) else MISSING
    if isinstance(raw, list | tuple):
        return [v for v in (_json(r, depth + 1) for r in raw) if v is not MISSING]
    if isinstance(raw, Mapping):
        pairs = ((k, _json(v, depth + 1)) for k, v in raw.items() if isinstance(k, str))
        return {k: v for k, v in pairs if v is not MISSING}
    return MISSING


def write(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        rest: Mapping[str, Any] = {}
        for f in fields(type(value)):
            item = getattr(value, f.name)
            if f.rest:
                rest = item
            elif item is None or (isinstance(item, tuple | Mapping) and not item):
                continue  # nulls and empty collections are left out
            else:
                out[f.key] = write(item)
        return {**{k: v for k, v in rest.items() if k not in out and v is not None}, **out}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [write(v) for v in value]
    if isinstance(value, Mapping):
        return {k: write(v) for k, v in value.items()}
    return value
