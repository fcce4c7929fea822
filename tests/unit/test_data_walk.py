"""The walk of the data from `reconcile` (`hack/walk.py`): how often the trip of the rollout's
body comes back into each module. Issue 20 asks for at most 5 everywhere; until then the figures
only go down (a ratchet: lower `CEILING` when a change lowers them)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections import Counter
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]

# Measured on this tree (the typed snapshot of a phase's reads, `controller/seen.py`); on
# ffd6df8, before it: observe 40, context 43, promoted 16, kubeobjects 10.
CEILING = {
    "kvgate.controller.seen": 22,
    "kvgate.controller.observe": 16,
    "kvgate.controller.handlers": 15,
    "kvgate.controller.context": 10,
    "kvgate.controller.record": 8,
}
OTHERS = 6  # every module not named above


def _walk_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvgate_walk", ROOT / "hack" / "walk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


def _re_entries(root: Path, entry: str, data: str) -> Counter[str]:
    walk = _walk_tool()
    modules = walk.load(root)
    module, _, name = entry.partition(":")
    walker = walk.Walker(modules)
    walker.walk(modules[module].functions[name], {data})
    return Counter({m: n - 1 for m, n in Counter(walker.trip).items()})


def test_the_walk_counts_each_return_into_the_caller(tmp_path: Path) -> None:
    # GIVEN a stage that hands the data to two helpers of another module, and a key that is
    # not data (`found[arm] = ...` carries `found`, not `arm`)
    pkg = tmp_path / "kvgate"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(
        textwrap.dedent("""
        def one(x):
            return x

        def two(x):
            return x

        def name_of(arm):
            return arm
    """)
    )
    (pkg / "stage.py").write_text(
        textwrap.dedent("""
        from kvgate import helpers

        def run(body):
            found = {}
            for arm in ("a", "b"):
                found[arm] = helpers.one(body)
            helpers.two(found)
            helpers.name_of(arm)
            return helpers.one(body.attribute)
    """)
    )
    # WHEN the body is walked from the stage
    counts = _re_entries(tmp_path, "kvgate.stage:run", "body")
    # THEN the trip went out twice and came back twice; the key and the attribute read off the
    # body are not the data
    assert counts == {"kvgate.stage": 2, "kvgate.helpers": 1}


def test_no_module_is_re_entered_more_than_it_was() -> None:
    counts = _re_entries(ROOT / "operator", "kvgate.controller.handlers:reconcile", "body")
    assert len(counts) > 10  # the walk went through the controller
    over = {module: n for module, n in counts.items() if n > CEILING.get(module, OTHERS)}
    assert over == {}, f"the data zigzags more than before through {over}"
