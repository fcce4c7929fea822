"""checkov (PyPI, its own venv: `make checkovenv`) over what kvgate installs and what it creates.

Scanned: the chart rendered by helm with each value set below, and the objects the operator
builds at run time (the eval Job, as `manifests.build_eval_job` makes it with the chart's
defaults, its image named by tag and, as the least-rights install has it, by digest), each
with the NetworkPolicy the operator creates for it. Every finding must be listed in docs/security.md's "Expected checkov findings", one
line each with its reason; a finding not listed fails the test, and so does a listed one that no
longer occurs (the list stays true). Tools tier: checkov takes about a minute per run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate import manifests
from kvgate.config import OperatorConfig
from kvgate.model import LABEL_ROLLOUT
from kvgate.spec import RolloutSpec

REPO = Path(__file__).resolve().parents[2]
CHECKOV = Path(os.environ.get("KVGATE_CHECKOV") or REPO / ".venv-checkov" / "bin" / "checkov")
SECURITY_MD = REPO / "docs" / "security.md"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.tools,
    pytest.mark.timeout(900),
    # Under CI a missing venv is a failure (make test builds it), never a silent skip.
    pytest.mark.skipif(
        not CHECKOV.is_file() and not IN_CI, reason=f"{CHECKOV} missing: run `make checkovenv`"
    ),
]

DIGEST = "sha256:" + "0" * 64
# The chart's value sets: the default install, the least-rights install docs/security.md
# recommends, a cluster-wide one, and one with monitoring objects and two replicas.
VALUE_SETS: dict[str, list[str]] = {
    "default": [],
    "least-rights": [
        "watch.namespaces={llm-prod}",
        f"image.digest={DIGEST}",
        f"evalImage.digest={DIGEST}",
        "hubTokenSecrets.enabled=true",
        "hubTokenSecrets.names={hf-token}",
        "networkPolicy.enabled=true",
        "networkPolicy.allowedNamespaces={monitoring}",
    ],
    "cluster-wide": ["watch.allNamespaces=true"],
    "monitoring": [
        "metrics.serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "replicas=2",
    ],
}
# docs/security.md: "- `CKV_K8S_21` `Job/demo-eval-1`: reason"
EXPECTED_LINE = re.compile(r"^- `(CKV2?_K8S_\d+)` `([A-Za-z]+/[a-z0-9.-]+)`: (\S.*)$")


def expected_findings() -> dict[tuple[str, str], str]:
    """The expected-findings list of docs/security.md: (check, Kind/name) -> reason."""
    text = SECURITY_MD.read_text(encoding="utf-8")
    section = text.split("### Expected checkov findings", 1)[1].split("\n#", 1)[0]
    found = {}
    for line in section.splitlines():
        m = EXPECTED_LINE.match(line)
        if m:
            found[(m[1], m[2])] = m[3]
    return found


def eval_job(rollout: str, image: str | None = None) -> dict[str, Any]:
    """The eval Job as the operator builds it with the chart's settings (create_eval_job);
    `image` None: the default, named by tag."""
    config = OperatorConfig()
    spec = RolloutSpec.from_dict(
        {"targetRef": {"name": "vllm"}, "gates": {"accuracy": {"longContext": {}}}}
    )
    return manifests.build_eval_job(
        rollout=rollout,
        namespace="llm-prod",
        attempt=1,
        image=image or config.eval_image,
        command=manifests.eval_command(
            spec,
            control_url="http://10.0.0.1:8000/v1/completions",
            candidate_url="http://10.0.0.2:8000/v1/completions",
            model="Qwen/Qwen3-8B",
            concurrency=config.eval_concurrency,
            max_model_len=32768,
            tokenizer="Qwen/Qwen3-8B",
        ),
        env={"PYTHONUNBUFFERED": "1"},
        resources=manifests.eval_resources(config.eval_resources, {}),
        deadline_s=3600,
        config_hash="0" * 16,
        service_account_name="kvgate-eval",  # the chart's evalServiceAccount
        nonce="0" * 32,
    )


def object_names(directory: Path) -> set[str]:
    """The metadata.name of every object in the YAML files under `directory`."""
    return {
        str(doc["metadata"]["name"])
        for path in directory.glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("metadata")
    }


def resource_key(resource: str, names: set[str]) -> str:
    """checkov's resource (`Kind.namespace.name`, `Kind.name`, and for graph checks the name
    followed by the pod labels) as `Kind/name`, with the object's own name."""
    kind, _, rest = resource.partition(".")
    known = [n for n in names if re.search(rf"(^|\.){re.escape(n)}(\.|$)", rest)]
    return f"{kind}/{max(known, key=len) if known else rest}"


def findings(directory: Path) -> Iterator[tuple[str, str, str]]:
    """(check id, Kind/name, file) for every failed check checkov reports under `directory`."""
    proc = subprocess.run(
        [str(CHECKOV), "--directory", str(directory), "--framework", "kubernetes",
         "--output", "json", "--quiet", "--compact", "--skip-download"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )  # fmt: skip
    assert proc.returncode in (0, 1), f"checkov exited {proc.returncode}: {proc.stderr[-2000:]}"
    report = json.loads(proc.stdout)
    names = object_names(directory)
    for block in report if isinstance(report, list) else [report]:
        for check in (block.get("results") or {}).get("failed_checks") or []:
            key = resource_key(str(check["resource"]), names)
            yield str(check["check_id"]), key, str(check["file_path"])


def test_the_expected_list_is_well_formed() -> None:
    found = expected_findings()
    assert found, "docs/security.md has no expected checkov findings section"
    assert all(len(reason) > 10 for reason in found.values())


def find_helm() -> str | None:
    """hack/build-binaries.sh's helm (as tests/unit/test_chart.py finds it), or one on PATH."""
    cache = Path(
        os.environ.get("KVGATE_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvgate"
    )
    found = sorted(cache.glob("bin/*/helm"), reverse=True)
    return str(found[0]) if found else shutil.which("helm")


def render(helm: str, sets: list[str]) -> str:
    args = ["template", "kvgate", str(REPO / "charts/kvgate"), "--namespace", "kvgate-system"]
    args += ["--kube-version", "v1.37.2", *(a for s in sets for a in ("--set", s))]
    scratch = "/tmp/kvgate-helm"  # helm's own dirs, never the user's
    env = {**os.environ, "HELM_CACHE_HOME": f"{scratch}/cache",
           "HELM_CONFIG_HOME": f"{scratch}/config", "HELM_DATA_HOME": f"{scratch}/data"}  # fmt: skip
    proc = subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert proc.returncode == 0, f"helm template {' '.join(sets)}: {proc.stderr}"
    return proc.stdout


def test_checkov_finds_only_the_expected(tmp_path: Path) -> None:
    helm = find_helm()
    if helm is None:
        if IN_CI:
            pytest.fail("helm is missing: run hack/build-binaries.sh")
        pytest.skip("helm is not built yet (hack/build-binaries.sh)")
    for name, sets in VALUE_SETS.items():
        (tmp_path / f"chart-{name}.yaml").write_text(render(helm, sets))
    # As a default install runs it (image by tag) and as the least-rights one (evalImage.digest).
    pinned = eval_job("pinned", f"ghcr.io/kvgate/kvgate-eval@{DIGEST}")
    for name, job in (("eval-job", eval_job("demo")), ("eval-job-pinned", pinned)):
        rollout = job["metadata"]["labels"][LABEL_ROLLOUT]
        policy = manifests.build_eval_network_policy(
            rollout=rollout, namespace="llm-prod", canary_port=8000, hub=True
        )  # the Job's own NetworkPolicy, created before it (controller/act.py)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all([policy, job], sort_keys=False))

    expected = expected_findings()
    seen: dict[tuple[str, str], set[str]] = {}
    for check, resource, file in findings(tmp_path):
        seen.setdefault((check, resource), set()).add(Path(file).name)
    unexpected = [
        f"{check} {resource} in {', '.join(sorted(files))}"
        for (check, resource), files in sorted(seen.items())
        if (check, resource) not in expected
    ]
    stale = [f"{c} {r}" for c, r in sorted(expected) if (c, r) not in seen]
    assert not unexpected, "checkov findings not in docs/security.md:\n" + "\n".join(unexpected)
    assert not stale, "listed in docs/security.md but no longer found:\n" + "\n".join(stale)
