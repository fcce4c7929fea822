"""The one reason vocabulary: what each reason means is asked of the reason, never of its text."""

from __future__ import annotations

import ast
import pathlib

import pytest

from kvgate.reasons import Reason

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "operator" / "kvgate"
# The modules whose control flow follows a rollout's reason (the core's decisions, the controller).
DECIDING = [
    *sorted((PACKAGE / "controller").glob("*.py")),
    *(
        PACKAGE / f"{m}.py"
        for m in (
            "flow/machine",
            "flow/steps",
            "judge/gates",
            "judge/verdict",
            "flow/deadlines",
            "judge/remedy",
        )
    ),
]


def test_an_unknown_stored_reason_reads_as_unknown_never_as_a_guess() -> None:
    assert Reason.read("CanaryCrashed") is Reason.CANARY_CRASHED
    for text in ("canarycrashed", "", None, 3, "Promoted "):
        assert Reason.read(text) is Reason.UNKNOWN


@pytest.mark.parametrize(
    ("reason", "warning", "permanent", "stalls"),
    [
        (Reason.INVALID_SPEC, True, True, False),
        (Reason.INVALID_TARGET, True, True, False),
        (Reason.REVERT_FAILED, True, False, True),
        (Reason.CANARY_CRASHED, True, False, False),
        (Reason.POOL_HAS_ROOM, False, False, False),
        (Reason.PROMOTED, False, False, False),
        (Reason.ACCURACY_NON_INFERIOR, False, False, False),
    ],
)
def test_each_rule_is_a_property_of_the_reason(
    reason: Reason, warning: bool, permanent: bool, stalls: bool
) -> None:
    assert (reason.warning, reason.permanent, reason.stalls) == (warning, permanent, stalls)


def test_a_reason_is_written_as_its_word() -> None:
    # status, Events and alerts carry the CamelCase word; the enum is the same string
    assert (
        Reason.CANARY_CRASHED == "CanaryCrashed" and str(Reason.CANARY_CRASHED) == "CanaryCrashed"
    )
    assert all(r.value[0].isupper() and " " not in r.value for r in Reason)


def _reason_compared_to_text(tree: ast.AST) -> list[int]:
    """Lines comparing something called `reason` with a string literal (== "X", in ("X", ...))."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        named = (isinstance(left, ast.Name) and "reason" in left.id) or (
            isinstance(left, ast.Attribute) and "reason" in left.attr
        )
        if not named:
            continue
        for right in node.comparators:
            items = right.elts if isinstance(right, ast.Tuple | ast.List | ast.Set) else [right]
            if any(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
                found.append(node.lineno)
    return found


def test_control_flow_never_branches_on_a_reason_string() -> None:
    offences = {
        str(path.relative_to(PACKAGE)): lines
        for path in DECIDING
        if (lines := _reason_compared_to_text(ast.parse(path.read_text())))
    }
    assert offences == {}


def test_the_check_finds_a_branch_on_a_reason_string() -> None:
    # the rule above can fail: the shapes it forbids are found
    code = 'if step.reason in ("InvalidSpec", "X"): pass\nif reason == "RevertFailed": pass\n'
    assert _reason_compared_to_text(ast.parse(code)) == [1, 2]


def test_every_reason_is_produced_somewhere() -> None:
    source = "\n".join(
        p.read_text()
        for p in PACKAGE.rglob("*.py")
        if p.name != "reasons.py" and "sim" not in p.parts
    )
    unused = [
        r.name for r in Reason if r is not Reason.UNKNOWN and f"Reason.{r.name}" not in source
    ]
    assert unused == []
