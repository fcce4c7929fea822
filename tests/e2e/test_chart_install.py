"""The chart's CRD and the examples against the API server's own validation, and the helpers
the chart's e2e tests share.

The chart's whole-rollout e2e (a release in a namespace enforcing Pod Security `restricted`,
under its own ServiceAccount's token, to `Promoted`) runs on the real node with the built
images: tests/harness/test_real_node.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from support import CHART, EXAMPLES

from kvgate.spec.margins import DEFAULT_MARGIN_PP


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_examples_pass_the_api_servers_validation(cluster: Any, namespace: str) -> None:
    proc = cluster.kubectl("apply", "--server-side", "-f", str(CHART / "crds"), check=False)
    assert proc.returncode == 0, proc.stderr
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/kvcacherollouts.kvgate.io", "--timeout=60s"
    )
    for name in ("auto", "manual", "report", "gate", "pull-request", "vllm-deployment"):
        path = EXAMPLES / f"{name}.yaml"
        proc = cluster.kubectl(
            "apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False
        )
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"
    # The defaults the API server fills in are the ones examples/auto.yaml spells out.
    auto = yaml.safe_load((EXAMPLES / "auto.yaml").read_text())
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-",
        input=yaml.safe_dump({**auto, "spec": {"targetRef": auto["spec"]["targetRef"]}}),
    )  # fmt: skip
    defaulted = json.loads(proc.stdout)["spec"]
    # Except the windows the example shortens for the simulated production (its comment says
    # so): the defaults are the production values.
    shortened = {
        ("gates", "capacity", "window"): "5m",
        ("gates", "capacity", "samples"): 10,
        ("promotion", "verifyWindow"): "10m",
    }
    example = json.loads(json.dumps(auto["spec"]))
    for path, default in shortened.items():
        *parents, leaf = path
        spelled, filled = example, defaulted
        for key in parents:
            spelled, filled = spelled[key], filled[key]
        assert filled[leaf] == default and spelled[leaf] != default, path
        spelled[leaf] = default
    for key in ("engine", "kvCacheDtype", "canary", "promotion"):
        assert defaulted[key] == example[key], key
    # The margin has no schema default (a sub-8-bit format must state one, so an unset margin
    # must stay unset): the example spells the operator's own default, 2 points.
    assert "margin" not in defaulted["gates"]["accuracy"]
    assert example["gates"]["accuracy"].pop("margin") == DEFAULT_MARGIN_PP
    for gate, values in example["gates"].items():
        assert defaulted["gates"][gate] == values, gate
