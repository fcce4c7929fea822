"""The layering in .importlinter holds: a pure core, kopf only at the top, an independent simulator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.fail("lint-imports is missing: install the dev extra (`make install`)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    result = subprocess.run(
        [lint_imports, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "11 kept, 0 broken" in result.stdout


def test_test_module_names_are_unique_across_the_suite() -> None:
    # pytest imports test modules by basename (no packages): a second test_x.py in another
    # folder stops collection of the whole suite with "import file mismatch"
    tests = Path(__file__).resolve().parents[1]
    names = sorted(p.name for p in tests.rglob("test_*.py"))
    assert [n for n in set(names) if names.count(n) > 1] == []
