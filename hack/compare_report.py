"""Does the report render what an earlier release's report rendered? Byte for byte, per rollout.

    .venv/bin/python hack/compare_report.py [--old d77d297] [--show-diff 40]

The earlier release (`--old`, a commit) and this tree each run their own fake-cluster
controller (`tests/unit/test_controller.World`) through the same scenarios, plus the report
tests' fixed states (`tests/unit/report_states.py`), and render every status with their own
report, text and HTML. Then:

- **same rollout, each release end to end**: the old status in the old report against the new
  status in the new report;
- **an old status in the new report**: what a rollout an earlier release wrote reads like after
  an upgrade, against the old report's rendering of it;
- **new status against old status, both in the new report**: what the controller now records
  for the same run, with the report held fixed.

Each pair is identical or shown as a unified diff of the text. The renders carry no clock
(the fake clock is fixed; `now` is not passed), so a difference is a difference of the report
or of what the controller recorded.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs inside one tree (PYTHONPATH: its operator/ and tests/unit): builds the corpus, renders it.
_CHILD = r"""
import copy, json, sys
import pytest
import test_controller as tc
import fake_cluster
from kvgate.report import render_html, render_text

out_path, statuses_in = sys.argv[1], sys.argv[2]

def scenarios():
    def world(**spec):
        return tc.World(pytest.MonkeyPatch(), **spec)
    def promoted():
        w = world(); w.run(); return w
    def reverted_after_promotion():
        w = world(); tc.new_pods_crash(w); w.run(); return w
    def l4_trap():
        w = world(extraArgs=[]); tc.jit_trap(w); w.run(); return w
    def l4_trap_remedied():
        w = world(extraArgs=[], canary={"startupTimeout": "60s", "remediation": "auto"})
        tc.jit_trap(w); w.run(); return w
    def accuracy_failed():
        w = world(); w.kube.eval_summary = {**fake_cluster.SUMMARY_PASS, "verdict": "fail"}
        w.run(); return w
    def awaiting_approval():
        w = world(promotion={"mode": "manual"})
        for _ in range(40):
            w.reconcile()
            if w.phase == "AwaitingApproval":
                break
        return w
    def canary_running():
        w = world()
        for _ in range(3):
            w.reconcile()
        return w
    for name, make in sorted(locals().items()):
        if callable(make) and name != "world":
            yield "run:" + name, make().obj

def fixed_states():
    try:
        import report_states
    except ImportError:
        return
    for name in ("l4_crash", "regressed", "promoted", "awaiting_approval", "canary", "evaluating"):
        make = getattr(report_states, name, None)
        if make is not None:
            yield "state:" + name, make()

rendered, rollouts = {}, {}
def render(name, obj):
    try:
        rendered[name] = {"text": render_text(obj), "html": render_html(obj)}
    except Exception as exc:  # a render that raises is a finding, not a crash of the tool
        rendered[name] = {"text": f"RAISED {type(exc).__name__}: {exc}", "html": ""}
for name, obj in [*scenarios(), *fixed_states()]:
    rollouts[name] = json.loads(json.dumps(obj, default=str))
    render(name, obj)
for name, obj in json.loads(open(statuses_in).read()).items():  # the other tree's rollouts
    render("foreign:" + name, obj)
json.dump({"rendered": rendered, "rollouts": rollouts}, open(out_path, "w"))
"""


def _run_tree(
    tree: Path, foreign: dict[str, object], out: Path
) -> dict[str, dict[str, dict[str, str]]]:
    statuses = out.with_suffix(".in.json")
    statuses.write_text(json.dumps(foreign))
    env = {**os.environ, "PYTHONPATH": f"{tree / 'operator'}{os.pathsep}{tree / 'tests' / 'unit'}"}
    subprocess.run([sys.executable, "-c", _CHILD, str(out), str(statuses)], env=env,
                   cwd=tree, check=True, timeout=900)  # fmt: skip
    result: dict[str, dict[str, dict[str, str]]] = json.loads(out.read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="d77d297", help="the earlier release's commit")
    parser.add_argument("--show-diff", type=int, default=40, help="diff lines shown per pair")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvgate-report-") as tmp:
        old_tree = Path(tmp) / "old"
        old_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old, "operator", "tests"],
                                 capture_output=True, check=True)  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
        old = _run_tree(old_tree, {}, Path(tmp) / "old.json")
        new = _run_tree(ROOT, old["rollouts"], Path(tmp) / "new.json")
    pairs = []
    for name in sorted(old["rendered"]):
        if name in new["rendered"]:
            pairs.append(("end to end", name, old["rendered"][name], new["rendered"][name]))
        foreign = new["rendered"].get("foreign:" + name)
        if foreign is not None:
            pairs.append(("old status", name, old["rendered"][name], foreign))
            if name in new["rendered"]:  # the status shapes alone, through this report
                pairs.append(("new status", name, foreign, new["rendered"][name]))
    same = 0
    for kind, name, before, after in pairs:
        text_same, html_same = before["text"] == after["text"], before["html"] == after["html"]
        same += text_same and html_same
        html_lines = sum(
            1
            for line in difflib.unified_diff(
                before["html"].splitlines(), after["html"].splitlines(), lineterm="", n=0
            )
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        )
        print(f"{'same' if text_same and html_same else 'DIFFERS':8} {kind:10} {name:32} "
              f"text {'=' if text_same else '≠'} html "
              f"{'=' if html_same else f'≠ ({html_lines} lines)'}")  # fmt: skip
        if not text_same and args.show_diff:
            diff = difflib.unified_diff(before["text"].splitlines(), after["text"].splitlines(),
                                        f"{args.old}", "this tree", lineterm="", n=0)  # fmt: skip
            for line in list(diff)[2 : 2 + args.show_diff]:
                print(f"           {line}")
    print(f"{same} of {len(pairs)} renders identical (text and HTML)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
