"""The judge reads typed evidence: `gates`, `machine`, `crash` and `remedy` read no evidence by
string key (`x["key"]`, `x.get("key")`), and `Observation` holds no open JSON (issue 38)."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from kvgate.flow.steps import Observation

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "kvgate"
JUDGES = ("judge/gates", "flow/machine", "judge/crash", "judge/remedy")


def string_key_reads(source: str) -> list[str]:
    """Each `x["key"]` and `x.get("key", ...)` in `source`, as `line: text`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        if isinstance(key, str):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_finder_finds_both_shapes() -> None:
    source = 'a = scan["findings"]\nb = summary.get("verdict")\nc = gates[name]\nd = x.get(k)\n'
    assert string_key_reads(source) == ["1: scan['findings']", "2: summary.get('verdict')"]


@pytest.mark.parametrize("module", JUDGES)
def test_the_judge_reads_no_evidence_by_string_key(module: str) -> None:
    source = (PACKAGE / f"{module}.py").read_text(encoding="utf-8")
    assert string_key_reads(source) == [], f"kvgate/{module}.py reads by string key"


def test_observation_holds_no_open_json() -> None:
    hints = typing.get_type_hints(Observation)
    open_fields = [
        f.name
        for f in dataclasses.fields(Observation)
        if "Mapping" in str(hints[f.name]) or "Any" in str(hints[f.name])
    ]
    assert open_fields == []
