"""hack/test_tiers.py's schedule: the harness runs beside fast, lmeval and tools, its test
kubelet's pods on a prefix of their own, and e2e starts only after it ended; every tier runs
once and is reported in the tiers' order."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvgate_test_tiers", ROOT / "hack/test_tiers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_the_harness_runs_beside_the_quick_tiers_and_ends_before_e2e(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    one_at_a_time: bool,
) -> None:
    tiers = _tool()
    events: list[str] = []
    envs: dict[str, dict[str, str] | None] = {}
    lock = threading.Lock()
    tools_ended = threading.Event()  # the harness ends after tools, if they overlap at all

    def run_tier(tier: str, out: Path, paths: list[str], extra: list[str], *, echo: bool = True,  # type: ignore[no-untyped-def]
                 env: dict[str, str] | None = None):  # fmt: skip
        with lock:
            events.append(f"start {tier}")
            envs[tier] = env
        if tier == "harness":
            (out / "harness.log").write_text("harness output\n")
            # beside the quick tiers it outlasts them; run alone first it would wait here in
            # vain (1 s) and end before fast started, which the assertions below catch
            tools_ended.wait(timeout=1.0)
        with lock:
            events.append(f"end {tier}")
        if tier == "tools":
            tools_ended.set()
        return tiers.TierResult(tier, 0, 1.0, tests=1), [(1.0, f"{tier}::t")]

    monkeypatch.setattr(tiers, "run_tier", run_tier)
    argv = ["--output-dir", str(tmp_path)] + (["--one-at-a-time"] if one_at_a_time else [])
    assert tiers.main(argv) == 0
    printed = capsys.readouterr().out
    if one_at_a_time:
        assert events == [f"{w} {t}" for t in tiers.TIERS for w in ("start", "end")]
        assert envs["harness"] is None
    else:
        # the harness started first and ran while the quick tiers did, its pods on 127.15.x.y
        # (hack/cluster.py: below the e2e workers' slices); e2e after it ended
        assert events[0] == "start harness"
        assert events.index("end harness") > events.index("end tools")
        assert events.index("start e2e") > events.index("end harness")
        assert envs["harness"] == {"KVGATE_POD_IP_PREFIX": "15"}
        assert all(envs[t] is None for t in tiers.TIERS if t != "harness")
        assert "harness output" in printed
    # each tier ran once; the summary lists every tier in the tiers' order
    assert sorted(events) == sorted(f"{w} {t}" for t in tiers.TIERS for w in ("start", "end"))
    summary = [line.split()[0] for line in printed.splitlines() if " ok " in f" {line} "]
    assert summary == list(tiers.TIERS)
