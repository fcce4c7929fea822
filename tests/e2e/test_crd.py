"""The KVCacheRollout CRD against the real apiserver: defaults, CEL rules, immutability, columns."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import install_crd

pytestmark = pytest.mark.e2e


def _cr(name: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kvgate.io/v1alpha1",
            "kind": "KVCacheRollout",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


@pytest.fixture
def crd(cluster: Any) -> Any:
    install_crd(cluster)
    return cluster


@pytest.mark.timeout(120)
def test_minimal_spec_gets_sre_defaults(crd: Any, namespace: str) -> None:
    crd.kubectl(
        "apply", "-n", namespace, "-f", "-", input=_cr("ok", {"targetRef": {"name": "qwen"}})
    )
    obj = json.loads(crd.kubectl("get", "kvr", "ok", "-n", namespace, "-o", "json").stdout)
    spec = obj["spec"]
    assert (spec["engine"], spec["kvCacheDtype"]) == ("auto", "fp8")
    assert spec["gates"]["capacity"] == {
        "mode": "require",
        "window": "5m",
        "samples": 10,
        "usageThreshold": 0.9,
    }
    assert spec["gates"]["scales"] == {"mode": "warn"}
    assert spec["gates"]["capacityGain"] == {"minRatio": 1.8}
    # no schema default for the margin (issue 39): a stated one must be told from none, since a
    # sub-8-bit format requires one; the operator reads 2 points when unset (kvgate.spec.margins)
    assert "margin" not in spec["gates"]["accuracy"]
    assert spec["gates"]["accuracy"]["questions"] == 500  # the section's other defaults stay
    assert spec["promotion"] == {"mode": "auto", "verifyWindow": "10m", "verifySamples": 5}
    assert "speed" not in spec["gates"]


PULL_REQUEST = {
    "provider": "gitea",
    "apiUrl": "http://127.0.0.1:3000/api/v1",
    "repository": "ops/serving",
    "path": "apps/vllm/kvgate-patch.yaml",
    "tokenSecretRef": {"name": "forge-token"},
}
INVALID = [
    ({}, "spec.targetRef: Required value"),
    ({"targetRef": {"name": "q"}, "engine": "trtllm"}, 'spec.engine: Unsupported value: "trtllm"'),
    (
        {"targetRef": {"name": "q"}, "engine": "sglang", "kvCacheDtype": "fp8"},
        "spec.kvCacheDtype: Invalid value: sglang does not accept --kv-cache-dtype fp8; use fp8_e4m3 or fp8_e5m2",
    ),
    (
        {"targetRef": {"name": "q"}, "kvCacheDtype": "int4"},
        'spec.kvCacheDtype: Unsupported value: "int4"',
    ),
    (
        {"targetRef": {"name": "q"}, "gates": {"accuracy": {"questions": 100, "chunk": 200}}},
        "spec.gates.accuracy.chunk: Invalid value: chunk must not exceed questions",
    ),
    (
        {"targetRef": {"name": "q"}, "gates": {"accuracy": {"margin": 0}}},
        "spec.gates.accuracy.margin: Invalid value: 0: spec.gates.accuracy.margin in body should be greater than 0",
    ),
    (
        {"targetRef": {"name": "q"}, "gates": {"accuracy": {"margin": 10.5}}},
        "spec.gates.accuracy.margin: Invalid value: gates.accuracy.margin above 10 "
        "points is for sub-8-bit KV formats only",
    ),
    (
        {"targetRef": {"name": "q"}, "kvCache": {"format": "turboquant_4bit_nc"}},
        "spec.gates.accuracy.margin: Required value: gates.accuracy.margin is required for a "
        "sub-8-bit KV format",
    ),
    (
        {
            "targetRef": {"name": "q"},
            "kvCache": {"format": "nvfp4"},
            "gates": {"accuracy": {"mode": "off", "margin": 6}},
        },
        "spec.gates.accuracy.mode: Invalid value: gates.accuracy.mode off is refused "
        "for a sub-8-bit KV format",
    ),
    (
        {"targetRef": {"name": "q"}, "gates": {"capacity": {"window": "5 minutes"}}},
        'spec.gates.capacity.window: Invalid value: "5 minutes"',
    ),
    (
        {"targetRef": {"name": "q"}, "promotion": {"mode": "yolo"}},
        'spec.promotion.mode: Unsupported value: "yolo"',
    ),
    (
        {"targetRef": {"name": "q"}, "extraEnv": [{"name": "1BAD", "value": "x"}]},
        'spec.extraEnv[0].name: Invalid value: "1BAD"',
    ),
    (
        {"targetRef": {"name": "q"}, "promotion": {"mode": "pullRequest"}},
        "promotion.pullRequest is required with mode pullRequest and only read with it",
    ),
    (
        {"targetRef": {"name": "q"}, "promotion": {"mode": "gate", "pullRequest": PULL_REQUEST}},
        "promotion.pullRequest is required with mode pullRequest and only read with it",
    ),
    (
        {
            "targetRef": {"name": "q"},
            "promotion": {
                "mode": "pullRequest",
                "pullRequest": {**PULL_REQUEST, "kind": "helmValues"},
            },
        },
        "valuesKey is required with kind helmValues and only read with it",
    ),
    (
        {
            "targetRef": {"name": "q"},
            "promotion": {
                "mode": "pullRequest",
                "pullRequest": {**PULL_REQUEST, "apiUrl": "https://me:pw@forge/api"},
            },
        },
        "spec.promotion.pullRequest.apiUrl: Invalid value",
    ),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("spec", "message"), INVALID)
def test_invalid_spec_is_rejected_naming_the_field(
    crd: Any, namespace: str, spec: dict[str, Any], message: str
) -> None:
    # GIVEN an invalid spec WHEN applied THEN the apiserver refuses it, naming the field
    proc = crd.kubectl("apply", "-n", namespace, "-f", "-", input=_cr("bad", spec), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert crd.kubectl("get", "kvr", "bad", "-n", namespace, check=False).returncode != 0


@pytest.mark.timeout(120)
def test_target_ref_is_immutable(crd: Any, namespace: str) -> None:
    crd.kubectl("apply", "-n", namespace, "-f", "-", input=_cr("imm", {"targetRef": {"name": "a"}}))
    proc = crd.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=_cr("imm", {"targetRef": {"name": "b"}}),
        check=False,
    )
    assert proc.returncode != 0
    assert (
        "spec.targetRef: Invalid value: targetRef is immutable; "
        "create a new KVCacheRollout for another Deployment"
    ) in proc.stderr, proc.stderr
    # Other fields stay editable.
    crd.kubectl(
        "apply", "-n", namespace, "-f", "-",
        input=_cr("imm", {"targetRef": {"name": "a"}, "promotion": {"mode": "report"}}),
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_status_subresource_and_printer_columns(crd: Any, namespace: str) -> None:
    crd.kubectl(
        "apply", "-n", namespace, "-f", "-", input=_cr("cols", {"targetRef": {"name": "qwen"}})
    )
    # A spec write cannot set status: it is a subresource.
    crd.kubectl(
        "patch",
        "kvr",
        "cols",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"status": {"phase": "Promoted"}}',
    )
    obj = json.loads(crd.kubectl("get", "kvr", "cols", "-n", namespace, "-o", "json").stdout)
    assert "status" not in obj or obj["status"].get("phase") != "Promoted"
    crd.kubectl(
        "patch", "kvr", "cols", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", '{"status": {"phase": "Evaluating", "reason": "Evaluating", "progress": "starting", '
        '"capacity": {"ratio": 2.0}, "accuracy": {"differencePp": -0.5}, '
        '"load": {"throughputGain": 1.41}}}',
    )  # fmt: skip
    out = crd.kubectl("get", "kvr", "-n", namespace).stdout.splitlines()
    assert out[0].split() == [
        "NAME", "PHASE", "REASON", "TARGET", "DTYPE", "PROGRESS", "ACC-DELTA-PP", "CAP-GAIN",
        "GAIN", "AGE"
    ]  # fmt: skip
    assert out[1].split()[:9] == [
        "cols", "Evaluating", "Evaluating", "qwen", "fp8", "starting", "-0.5", "2", "1.41"
    ]  # fmt: skip
    wide = crd.kubectl("get", "kvr", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert "READY" in wide and "MESSAGE" in wide


@pytest.mark.timeout(120)
def test_a_name_too_long_for_the_child_labels_is_refused(crd: Any, namespace: str) -> None:
    proc = crd.kubectl(
        "apply", "-n", namespace, "-f", "-", input=_cr("r" * 64, {"targetRef": {"name": "q"}}),
        check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "at most 63 characters" in proc.stderr, proc.stderr
    ok = crd.kubectl(
        "apply", "-n", namespace, "-f", "-", input=_cr("r" * 63, {"targetRef": {"name": "q"}})
    )
    assert ok.returncode == 0


def _covering_statuses() -> list[dict[str, Any]]:
    """Statuses the fake-cluster controller writes (tests/unit), richest first, until together
    they hold every top-level key any of them holds."""
    unit = str(Path(__file__).resolve().parents[1] / "unit")
    if unit not in sys.path:
        sys.path.insert(0, unit)
    from test_status import _leaves, fake_cluster_statuses

    seen = sorted(fake_cluster_statuses(), key=lambda s: -len(list(_leaves(s))))
    wanted = {k for s in seen for k in s}
    chosen: list[dict[str, Any]] = []
    for status in seen:
        if not set(status) <= {k for c in chosen for k in c}:
            chosen.append(status)
    assert {k for c in chosen for k in c} == wanted
    return chosen


@pytest.mark.timeout(300)
def test_a_full_status_is_stored_and_read_back_unchanged(
    crd: Any, namespace: str, tmp_path: Path
) -> None:
    # GIVEN the statuses the fake-cluster controller writes (the typed schema's whole surface)
    statuses = _covering_statuses()
    assert {"arms", "preflight", "accuracy", "speed", "promotion", "remediation", "revert",
            "gates", "verdict", "conditions", "capacity", "eval"} <= {k for s in statuses for k in s}  # fmt: skip
    for i, status in enumerate(statuses):
        name = f"full-{i}"
        crd.kubectl(
            "apply", "-n", namespace, "-f", "-", input=_cr(name, {"targetRef": {"name": "q"}})
        )
        # WHEN each is written through the status subresource, as the operator writes it
        patch = tmp_path / f"{name}.json"
        patch.write_text(json.dumps({"status": status}))
        crd.kubectl(
            "patch", "kvr", name, "-n", namespace, "--subresource=status", "--type=merge",
            "--patch-file", str(patch),
        )  # fmt: skip
        # THEN the apiserver keeps it whole: nothing pruned, nothing refused
        obj = json.loads(crd.kubectl("get", "kvr", name, "-n", namespace, "-o", "json").stdout)
        assert obj["status"] == status, name


@pytest.mark.timeout(180)
def test_an_old_stored_status_survives_and_a_never_written_spelling_does_not(
    crd: Any, namespace: str, tmp_path: Path
) -> None:
    """One name per fact (issue 38): the spellings a release wrote are declared, so a status
    the dict writer stored is kept whole; a spelling nobody wrote is not, so it is pruned."""
    unit = str(Path(__file__).resolve().parents[1] / "unit")
    if unit not in sys.path:
        sys.path.insert(0, unit)
    from test_status import DICT_WRITER_STATUS

    guessed = {"arms": {"control": {"scan": {"kvDtype": "auto", "kvCacheDtype": "fp8"}}},
               "recommended_args": ["vllm"], "capacity": {"gain": 2.0, "ratio": 2.0}}  # fmt: skip
    for name, status in (("old-status", DICT_WRITER_STATUS), ("guessed", guessed)):
        crd.kubectl(
            "apply", "-n", namespace, "-f", "-", input=_cr(name, {"targetRef": {"name": "q"}})
        )
        patch = tmp_path / f"{name}.json"
        patch.write_text(json.dumps({"status": status}))
        crd.kubectl(
            "patch", "kvr", name, "-n", namespace, "--subresource=status", "--type=merge",
            "--patch-file", str(patch),
        )  # fmt: skip
    stored = json.loads(
        crd.kubectl("get", "kvr", "old-status", "-n", namespace, "-o", "json").stdout
    )
    assert stored["status"] == DICT_WRITER_STATUS
    pruned = json.loads(crd.kubectl("get", "kvr", "guessed", "-n", namespace, "-o", "json").stdout)
    assert pruned["status"] == {"arms": {"control": {"scan": {"kvCacheDtype": "fp8"}}},
                                "capacity": {"ratio": 2.0}}  # fmt: skip
