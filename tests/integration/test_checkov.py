"""checkov (PyPI, its own venv: `make checkovenv`) over what kvgate installs and what it creates.

Scanned: the chart rendered by helm with each value set below, and the objects the operator
builds at run time (the eval Job, as `manifests.build_eval_job` makes it with the chart's
defaults, and the load Job, as `manifests.build_load_job` makes it; each with its image named
by tag and, as the least-rights install has it, by digest), each with the NetworkPolicy the
operator creates for it. Each value set and each Job is scanned in a directory of its own:
checkov's graph checks match a NetworkPolicy to any pod in the same scan, so one value set's
operator policy would otherwise hide another's missing one (security-2.md, finding E). Every
finding must be listed in docs/security.md's "Expected checkov findings", one line each with
its reason; a finding not listed fails the test, and so does a listed one that no longer occurs
(the list stays true). Tools tier: checkov takes about a minute per run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.change import manifests
from kvgate.config import OperatorConfig
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import LABEL_ROLLOUT

REPO = Path(__file__).resolve().parents[2]
CHECKOV = Path(os.environ.get("KVGATE_CHECKOV") or REPO / ".venv-checkov" / "bin" / "checkov")
SECURITY_MD = REPO / "docs" / "security.md"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.tools,
    pytest.mark.timeout(1800),
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
        f"loadImage.digest={DIGEST}",
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


def load_job(rollout: str, image: str | None = None) -> dict[str, Any]:
    """The load Job as the operator builds it with the chart's settings (create_load_job)."""
    config = OperatorConfig()
    return manifests.build_load_job(
        rollout=rollout,
        namespace="llm-prod",
        attempt=1,
        image=image or config.load_job_image,
        command=manifests.load_command(
            control_url="http://10.0.0.1:8000",
            candidate_url="http://10.0.0.2:8000",
            model="Qwen/Qwen3-8B",
            production_concurrency=8,
            prompt_tokens=512,
            output_tokens=128,
            max_concurrency=64,
            deadline_s=1800,
            tokenizer="Qwen/Qwen3-8B",
        ),
        deadline_s=1800,
        config_hash="0" * 16,
        env={"PYTHONUNBUFFERED": "1", "KVGATE_GSM8K_DIR": "/data/gsm8k"},
        resources=config.load_resources,
        service_account_name="kvgate-eval",
        nonce="0" * 32,
    )


def run_time_objects() -> dict[str, list[dict[str, Any]]]:
    """Each Job the operator makes, with the NetworkPolicy it creates before it (act.py)."""
    pinned = f"@{DIGEST}"
    jobs = {
        "eval-job": (eval_job("demo"), True),
        "eval-job-pinned": (eval_job("pinned", f"ghcr.io/kvgate/kvgate-eval{pinned}"), True),
        "load-job": (load_job("demo"), False),
        "load-job-pinned": (load_job("pinned", f"ghcr.io/kvgate/kvgate-load{pinned}"), False),
    }
    out = {}
    for name, (job, hub) in jobs.items():
        policy = manifests.build_eval_network_policy(
            rollout=job["metadata"]["labels"][LABEL_ROLLOUT], namespace="llm-prod",
            canary_port=8000, hub=hub, role=job["metadata"]["labels"]["kvgate.io/arm"],
        )  # fmt: skip
        out[name] = [policy, job]
    return out


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
    scans: dict[str, str] = {
        f"chart-{name}": render(helm, sets) for name, sets in VALUE_SETS.items()
    }
    for name, objects in run_time_objects().items():
        scans[name] = yaml.safe_dump_all(objects, sort_keys=False)
    for name, text in scans.items():  # one directory each: no scan sees another's objects
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.yaml").write_text(text)

    expected = expected_findings()
    seen: dict[tuple[str, str], set[str]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:  # checkov is single-threaded
        scanned = list(pool.map(lambda name: list(findings(tmp_path / name)), sorted(scans)))
    for found in scanned:
        for check, resource, file in found:
            seen.setdefault((check, resource), set()).add(Path(file).name)
    unexpected = [
        f"{check} {resource} in {', '.join(sorted(files))}"
        for (check, resource), files in sorted(seen.items())
        if (check, resource) not in expected
    ]
    stale = [f"{c} {r}" for c, r in sorted(expected) if (c, r) not in seen]
    assert not unexpected, "checkov findings not in docs/security.md:\n" + "\n".join(unexpected)
    assert not stale, "listed in docs/security.md but no longer found:\n" + "\n".join(stale)


def test_each_value_set_and_each_job_is_scanned_alone() -> None:
    """The scan list: every value set and both Jobs, each with its image by tag and by digest."""
    objects = run_time_objects()
    assert sorted(objects) == ["eval-job", "eval-job-pinned", "load-job", "load-job-pinned"]
    for name, (policy, job) in objects.items():
        arm = job["metadata"]["labels"]["kvgate.io/arm"]
        assert policy["spec"]["podSelector"]["matchLabels"]["kvgate.io/arm"] == arm, name
        assert job["kind"] == "Job" and arm in name
    assert "loadImage.digest=" + DIGEST in VALUE_SETS["least-rights"]
