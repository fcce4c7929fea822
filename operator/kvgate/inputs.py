"""Bounded readers for the files and values kvgate is handed: no traceback, hang or blow-up.

Every command that reads a JSON or YAML file goes through here:

    >>> obj = load_file("rollout.yaml")          # JSON or YAML, one object

A file is read up to `MAX_FILE_BYTES` (more is refused, so `/dev/zero` costs 8 MiB, not all
memory), must be UTF-8, may nest at most `MAX_DEPTH` levels, and YAML may not use aliases
(a "billion laughs" document expands a few hundred bytes into gigabytes). Failures are one
`ParseError` naming the file. `finite_float` and `bounded_int` are argparse types that give
one clear line for NaN, infinities, huge or non-ASCII numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

from kvgate.errors import ParseError
from kvgate.spec.reader import is_label, is_subdomain, parse_duration

MAX_FILE_BYTES: Final = 8 << 20
MAX_DEPTH: Final = 64
_TOO_LARGE: Final = f"is larger than {MAX_FILE_BYTES >> 20} MiB; not a kvgate input"
_LOADER: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# -- files -------------------------------------------------------------------------------------


def read_text(path: str | Path, *, regular: bool = False) -> str:
    """At most MAX_FILE_BYTES of a UTF-8 file (`-` is stdin; a BOM is dropped): a larger file is
    refused, not cut, and other bytes are one ParseError with the offset."""
    name = str(path)
    if name == "-":
        data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    else:
        try:
            with open(path, "rb") as handle:
                if regular and not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise ParseError(name, "is not a regular file")
                data = handle.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            raise ParseError(name, "no such file") from None
        except IsADirectoryError:
            raise ParseError(name, "is a directory; pass a file") from None
        except PermissionError:
            raise ParseError(name, "permission denied") from None
        except OSError as exc:
            raise ParseError(
                name, f"cannot be read ({exc.strerror or type(exc).__name__})"
            ) from None
    if len(data) > MAX_FILE_BYTES:
        raise ParseError(name, _TOO_LARGE)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParseError(name, f"is not UTF-8 text (byte {exc.start})") from None


def load_file(path: str | Path, *, every: bool = False) -> Any:
    """A JSON or YAML document (JSON when it starts with `{` or `[`); `every`: a YAML file's
    documents, as a list."""
    text = read_text(path)
    if text.lstrip()[:1] in ("{", "["):
        return load_json(text, str(path))
    return load_yaml(text, str(path), every=every)


def load_documents(path: str | Path) -> list[Any]:
    """Every document of a multi-document YAML file (`---` between them), or of a JSON value
    (an array: its elements); a `kind: List` (`kubectl get -o yaml` of several objects) gives
    its items."""
    value = load_file(path, every=True)
    docs = value if isinstance(value, list) else [value]
    out: list[Any] = []
    for doc in docs:
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else None
        out.extend(items if isinstance(items, list) else [doc])
    return [d for d in out if d is not None]  # an empty document (a trailing `---`)


# -- texts -------------------------------------------------------------------------------------


def load_json(text: str, source: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` with its deep-nesting, huge-number and malformed cases as ParseError."""
    if len(text) > MAX_FILE_BYTES:
        raise ParseError(source, _TOO_LARGE)
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ParseError(source, f"malformed JSON: {exc.msg}", line_no=exc.lineno) from None
    except RecursionError:
        raise ParseError(source, f"nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # int digits over sys.get_int_max_str_digits, NaN/Infinity
        raise ParseError(source, f"malformed JSON: {str(exc)[:120]}") from None
    _check_depth(value, source, max_depth)
    return value


def load_yaml(text: str, source: str, *, every: bool = False) -> Any:
    """`yaml.safe_load` without aliases and at most MAX_DEPTH levels deep (`every`: the list
    of all documents, as `yaml.safe_load_all`)."""
    if len(text) > MAX_FILE_BYTES:
        raise ParseError(source, _TOO_LARGE)
    depth = 0
    try:
        # Events first (libyaml, no recursion): aliases and depth are refused before any
        # object is built.
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.AliasEvent):
                raise ParseError(source, "uses YAML aliases (*name); write the values out")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ParseError(source, f"nests deeper than {MAX_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        if every:
            return list(yaml.load_all(text, Loader=_LOADER))
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ParseError(source, f"not YAML: {str(problem)[:120]}", line_no=line) from None
    except ParseError:  # an alias or the depth, said above (a ParseError is a ValueError)
        raise
    except ValueError as exc:  # e.g. a huge YAML integer
        raise ParseError(source, f"not YAML: {str(exc)[:120]}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_depth(value: Any, source: str, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise ParseError(source, f"nests deeper than {max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


# -- argparse types ----------------------------------------------------------------------------


def finite_float(low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite float in [low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text) if text.isascii() else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number")
        if (limits := _outside(value, low, high, False)) is not None:
            raise argparse.ArgumentTypeError(f"{value:g} is outside {limits}")
        return value

    parse.__name__ = "number"  # argparse names the type in its messages
    return parse


def kube_name(*, label: bool = False) -> Callable[[str], str]:
    """An argparse type: a Kubernetes object name (a namespace's with `label`), refused before
    any API call rather than sent to the apiserver as a path."""
    valid, rule = (
        (is_label, "lower-case letters, digits and '-', at most 63")
        if label
        else (is_subdomain, "lower-case letters, digits, '-' and '.', at most 253")
    )

    def parse(text: str) -> str:
        if not valid(text):
            raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a Kubernetes name ({rule})")
        return text

    parse.__name__ = "name"
    return parse


# One convention for every command (first-hour-2 #20, N16, N22): a time is seconds (90) or a
# duration (90s, 5m, 1h30m); a share (margin, threshold, confidence) is a fraction (0.02) or a
# number with its unit (2%, 2pp).
DURATION_FORMS: Final = "seconds (90) or a duration (90s, 5m, 1h30m)"
FRACTION_FORMS: Final = "a fraction (0.02) or a percentage (2%, 2pp)"


def duration_seconds(text: str) -> float:
    """`"90"`, `"90s"`, `"5m"`, `"1h30m"`, `"250ms"` -> seconds; ValueError names both forms."""
    stripped = text.strip() if isinstance(text, str) else ""
    try:
        value = float(stripped) if stripped.isascii() else math.nan
    except ValueError:
        try:
            return parse_duration(stripped)
        except ValueError:
            raise ValueError(f"{text[:40]!r} is not {DURATION_FORMS}") from None
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]!r} is not {DURATION_FORMS}")
    return value


def share(text: str) -> float:
    """`"0.02"`, `"2%"`, `"2pp"` -> 0.02; ValueError names the forms."""
    stripped = text.strip().lower() if isinstance(text, str) else ""
    scale = 1.0
    for unit in ("pp", "%"):
        if stripped.endswith(unit):
            stripped, scale = stripped.removesuffix(unit).strip(), 0.01
            break
    try:
        value = float(stripped) * scale if stripped.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]!r} is not {FRACTION_FORMS}")
    return value


def seconds(
    low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a time in seconds, written as seconds or a duration, in [low, high]."""
    return _bounded(duration_seconds, "duration", low, high, low_open, " s")


def fraction(
    low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a share written as a fraction or a percentage, in [low, high]."""
    return _bounded(share, "fraction", low, high, low_open, "")


def _bounded(
    read: Callable[[str], float],
    name: str,
    low: float | None,
    high: float | None,
    low_open: bool,
    unit: str,
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if (limits := _outside(value, low, high, low_open)) is not None:
            hint = ""
            if name == "fraction" and high is not None and high <= 1 < value <= 100:
                hint = f": a fraction; write {value / 100:g} or {value:g}%"
            raise argparse.ArgumentTypeError(f"{text.strip()[:40]} is outside {limits}{unit}{hint}")
        return value

    parse.__name__ = name
    return parse


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer of ASCII digits in [low, high]."""

    def parse(text: str) -> int:
        digits = text.strip().removeprefix("-").removeprefix("+")
        if not (text.isascii() and digits.isdigit() and len(digits) <= 18):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside [{low}, {high}]")
        return value

    parse.__name__ = "integer"
    return parse


def _outside(value: float, low: float | None, high: float | None, low_open: bool) -> str | None:
    """The range `value` is outside of, as the messages print it ("[0, 1]"); None: inside."""
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        left = "(" if low_open else "["
        return f"{left}{_g(low, '-inf')}, {_g(high, 'inf')}]"
    return None


def _g(bound: float | None, none: str) -> str:
    return none if bound is None else f"{bound:g}"
