"""charts/kvgate/argocd/health.lua through Argo CD's own health evaluator (tier `tools`).

The evaluator is Argo CD's Go code, built from its module at the version pinned in
hack/build-binaries.sh (`--gitops`: hack/go/argocd-health/, `argocd-health`): argocd-cm parsed by
util/settings, then gitops-engine's health.GetResourceHealth over util/lua's
ResourceHealthOverrides, the application controller's path for a resource customization
(gopher-lua, the standard libraries closed but base, table, package and a safe os). `-builtin`
is the path Argo CD's own unit test takes for its built-in scripts (util/lua health_test.go,
standard libraries open).

The cases are in Argo CD's layout beside the script (charts/kvgate/argocd/health_test.yaml,
testdata/), so the directory could be contributed as
resource_customizations/kvgate.io/KVCacheRollout/. tests/unit/test_argocd_health.py runs the
same script under lupa in the fast tier; here Argo CD itself judges it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.records import conditions as cond
from kvgate.records.codec import write
from kvgate.vocabulary import Phase

pytestmark = [pytest.mark.integration, pytest.mark.tools]

ROOT = Path(__file__).resolve().parents[2]
ARGOCD_DIR = ROOT / "charts/kvgate/argocd"
SCRIPT = ARGOCD_DIR / "health.lua"
TESTS = ARGOCD_DIR / "health_test.yaml"
BUILD = ROOT / "hack/build-binaries.sh"
MODES = ("auto", "manual", "report", "gate", "pullRequest")
CM_KEY = "resource.customizations.health.kvgate.io_KVCacheRollout"  # charts/kvgate/README.md


def pinned_version() -> str:
    match = re.search(r'^ARGOCD_VERSION="(v[^"]+)"', BUILD.read_text(), re.MULTILINE)
    assert match, "ARGOCD_VERSION not found in hack/build-binaries.sh"
    return match.group(1)


@pytest.fixture(scope="module")
def evaluator() -> Path:
    out = subprocess.run(
        [str(BUILD), "--print"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()
    binary = Path(out) / "argocd-health"
    stamp = Path(out) / ".argocd-health.stamp"
    if not binary.is_file():
        message = "no argocd-health binary: run `make binaries` (hack/build-binaries.sh --gitops)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: not skipping)", pytrace=False)
        pytest.skip(message)
    # a binary of another Argo CD version would judge with other code: never silently
    assert stamp.read_text().split()[0] == pinned_version(), (
        f"{binary} was built for {stamp.read_text().strip()}, not {pinned_version()}: "
        "run hack/build-binaries.sh --gitops"
    )
    return binary


def run(binary: Path, *args: str | Path) -> tuple[int, Any]:
    proc = subprocess.run(
        [str(binary), *map(str, args)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode in (0, 1), f"exit {proc.returncode}: {proc.stderr}"
    lines = proc.stdout.splitlines()
    assert lines, f"no output (exit {proc.returncode}): {proc.stderr}"
    values = [json.loads(line) for line in lines]
    return proc.returncode, values[0] if len(values) == 1 else values


def cases() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(TESTS.read_text())["tests"]
    return tests


@pytest.fixture(scope="module", params=["argocd-cm", "builtin"])
def judged(request: pytest.FixtureRequest, evaluator: Path) -> dict[str, dict[str, Any]]:
    """Every case of health_test.yaml judged by Argo CD, one run, by inputPath."""
    flags = ["-builtin"] if request.param == "builtin" else []
    code, results = run(evaluator, "-script", SCRIPT, "-tests", TESTS, *flags)
    by_path = {r["inputPath"]: r for r in results}
    assert len(by_path) == len(cases())
    assert code == (0 if all(r["match"] for r in results) else 1)
    return by_path


def test_the_cases_cover_every_phase_and_mode() -> None:
    seen_phases: set[str] = set()
    seen_modes: set[str] = set()
    for case in cases():
        obj = yaml.safe_load((ARGOCD_DIR / case["inputPath"]).read_text())
        seen_modes.add(obj["spec"]["promotion"]["mode"])
        if "status" in obj:
            seen_phases.add(obj["status"]["phase"])
    assert seen_phases == {p.value for p in Phase}
    assert seen_modes == set(MODES)


@pytest.mark.parametrize("case", cases(), ids=lambda c: Path(c["inputPath"]).stem)
def test_argo_cd_shows_what_the_case_says(
    judged: dict[str, dict[str, Any]], case: dict[str, Any]
) -> None:
    got = judged[case["inputPath"]]["got"]
    assert got.get("error", "") == ""
    assert {"status": got["status"], "message": got["message"]} == case["healthStatus"]


# --- every phase in every mode, with the conditions the operator writes ------------------------
ENDS = {"Promoted", "RolledBack", "NotNeeded", "Failed", "Declined"}


def matrix_rollout(mode: str, phase: str) -> dict[str, Any]:
    """A rollout in `phase` under `mode`, its conditions from kvgate.records.conditions as record.py
    sets them (gate mode closes on every end but a passing verdict; a report or gate verdict
    parks in AwaitingApproval with reason VerdictReported)."""
    verdict = phase == "AwaitingApproval" and mode in ("report", "gate")
    reason = "VerdictReported" if verdict else f"{phase}Reason"
    gate_closed = mode == "gate" and phase in ENDS
    message = f"gate closed: {phase} here" if gate_closed else f"{phase} here"
    conditions = cond.summary_conditions(
        (),
        Phase(phase),
        reason,
        message,
        generation=3,
        now="2026-12-01T10:00:00Z",
        ready_without_terminal=verdict,
        stalled=gate_closed,
        gate_closed=gate_closed,
    )
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "KVCacheRollout",
        "metadata": {"name": "r", "namespace": "ns", "generation": 3},
        "spec": {"targetRef": {"name": "vllm"}, "promotion": {"mode": mode}},
        "status": {
            "phase": phase,
            "reason": reason,
            "message": message,
            "observedGeneration": 3,
            "conditions": [write(c) for c in conditions],
        },
    }


def documented(obj: Mapping[str, Any]) -> tuple[str, str]:
    """What docs/gitops.md and charts/kvgate/README.md say Argo CD shows (written from the docs,
    not from the script)."""
    status, mode = obj["status"], obj["spec"]["promotion"]["mode"]
    phase, reason, message = status["phase"], status["reason"], status["message"]
    stalled = any(c["type"] == "Stalled" and c["status"] == "True" for c in status["conditions"])
    if stalled:  # Failed always, and every closed gate
        return "Degraded", f"{reason}: {message}"
    if mode == "gate":
        if phase == "AwaitingApproval" and reason == "VerdictReported":
            return "Healthy", f"Gate open: {message}"
        return "Progressing", f"{phase}: {message}"
    if mode == "report" and phase in ("AwaitingApproval", "RolledBack", "NotNeeded", "Promoted"):
        return "Healthy", f"Report: {message}"
    health = {
        "Promoted": "Healthy",
        "NotNeeded": "Healthy",
        "RolledBack": "Degraded",
        "Declined": "Degraded",
        "AwaitingApproval": "Suspended",
        "PullRequestOpen": "Suspended",
    }.get(phase, "Progressing")
    return health, f"{phase}: {message}"


def test_every_phase_in_every_mode(evaluator: Path, tmp_path: Path) -> None:
    tests = []
    for mode in MODES:
        for phase in Phase:
            obj = matrix_rollout(mode, phase.value)
            name = f"{mode}-{phase.value}.yaml"
            (tmp_path / name).write_text(yaml.safe_dump(obj))
            status, message = documented(obj)
            tests.append(
                {"healthStatus": {"status": status, "message": message}, "inputPath": name}
            )
    (tmp_path / "health_test.yaml").write_text(yaml.safe_dump({"tests": tests}))
    code, results = run(evaluator, "-script", SCRIPT, "-tests", tmp_path / "health_test.yaml")
    wrong = [(r["inputPath"], r["expected"], r["got"]) for r in results if not r["match"]]
    assert (code, wrong) == (0, [])
    assert len(results) == len(MODES) * len(Phase) == 80


# --- the parts of the path that only Argo CD has ----------------------------------------------
def test_the_readme_configmap_key_is_the_one_argo_cd_reads(evaluator: Path, tmp_path: Path) -> None:
    """charts/kvgate/README.md's argocd-cm key, parsed by Argo CD's settings manager."""
    case = cases()[0]
    resource = ARGOCD_DIR / case["inputPath"]
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "argocd-cm", "namespace": "argocd"},
        "data": {CM_KEY: SCRIPT.read_text()},
    }
    assert CM_KEY in (ROOT / "charts/kvgate/README.md").read_text()
    (tmp_path / "argocd-cm.yaml").write_text(yaml.safe_dump(cm))
    code, got = run(evaluator, "-argocd-cm", tmp_path / "argocd-cm.yaml", resource)
    assert (code, got) == (0, {**case["healthStatus"]})
    # the kind without its group is another key to Argo CD: no health check at all
    cm["data"] = {"resource.customizations.health.KVCacheRollout": SCRIPT.read_text()}
    (tmp_path / "argocd-cm.yaml").write_text(yaml.safe_dump(cm))
    code, got = run(evaluator, "-argocd-cm", tmp_path / "argocd-cm.yaml", resource)
    assert code == 1 and got["error"].startswith("no health check applies to kvgate.io/")


def test_a_rollout_being_deleted_is_argo_cds_own_call(evaluator: Path, tmp_path: Path) -> None:
    """gitops-engine answers before the script for a terminating object (kopf's finalizer is no
    Argo CD hook finalizer): the script never sees it."""
    obj = matrix_rollout("auto", "Promoted")
    obj["metadata"]["deletionTimestamp"] = "2026-12-01T11:00:00Z"
    obj["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(obj))
    assert run(evaluator, "-script", SCRIPT, tmp_path / "r.yaml") == (
        0,
        {"status": "Progressing", "message": "Pending deletion"},
    )


def test_argo_cd_closes_the_string_library_to_a_customization(
    evaluator: Path, tmp_path: Path
) -> None:
    """What lupa cannot show: an argocd-cm script runs without Lua's string library (only a
    built-in script gets it), so health.lua must not use it. A script that does is Unknown."""
    assert not re.search(r"\bstring\.|:\s*(format|sub|find|match|gsub|len|lower|upper)\(",
                         SCRIPT.read_text())  # fmt: skip
    probe = tmp_path / "probe.lua"
    probe.write_text(
        'local hs = {}\nhs.status = "Healthy"\nhs.message = string.format("%s", "x")\nreturn hs\n'
    )
    resource = ARGOCD_DIR / cases()[0]["inputPath"]
    code, got = run(evaluator, "-script", probe, resource)
    assert code == 1 and got["status"] == "Unknown" and "string" in got["error"]
    assert run(evaluator, "-builtin", "-script", probe, resource) == (
        0,
        {"status": "Healthy", "message": "x"},
    )


def test_a_wrong_expectation_fails(evaluator: Path, tmp_path: Path) -> None:
    """The harness can fail: one case's message changed makes that case, and the run, fail."""
    tests = cases()
    for case in tests:
        (tmp_path / "testdata").mkdir(exist_ok=True)
        src = ARGOCD_DIR / case["inputPath"]
        (tmp_path / case["inputPath"]).write_text(src.read_text())
    tests[3] = {**tests[3], "healthStatus": {**tests[3]["healthStatus"], "message": "nope"}}
    (tmp_path / "health_test.yaml").write_text(yaml.safe_dump({"tests": tests}))
    code, results = run(evaluator, "-script", SCRIPT, "-tests", tmp_path / "health_test.yaml")
    assert code == 1
    assert [r["inputPath"] for r in results if not r["match"]] == [tests[3]["inputPath"]]
