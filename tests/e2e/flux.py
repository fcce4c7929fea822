"""Flux's own controllers against the test control plane: source-controller and
kustomize-controller as host processes, built from Go modules by
`hack/build-binaries.sh --flux` (versions pinned there), their CRDs from the same modules.

No tests here. `FluxControllers.start(cluster, work)` installs the CRDs, starts both controllers
(leader election off, every namespace watched, each on loopback ports of its own; the artifact
server on 127.0.0.1, which kustomize-controller fetches from) and waits until both answer their
health probes. `stop()` deletes the Flux objects (so their finalizers are removed), then sends
SIGTERM to each process group.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, apply, free_port, get, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from forge import LoopbackGitea, gitea_binary

BUILD = ROOT / "hack/build-binaries.sh"
NAMES = ("flux-source-controller", "flux-kustomize-controller")


def flux_bin_dir() -> Path | None:
    """The cache holding both controllers and flux-crds/, or None when `--flux` has not run."""
    out = subprocess.run(
        [str(BUILD), "--print"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()
    d = Path(out)
    ok = all((d / n).is_file() for n in NAMES) and any((d / "flux-crds").glob("*.yaml"))
    return d if ok else None


class FluxControllers:
    def __init__(self, cluster: Any, work: Path, bin_dir: Path) -> None:
        self.cluster = cluster
        self.work = work
        self.bin_dir = bin_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.health: dict[str, int] = {}

    @classmethod
    @contextmanager
    def start(cls, cluster: Any, work: Path, bin_dir: Path) -> Iterator[FluxControllers]:
        flux = cls(cluster, work, bin_dir)
        try:
            flux._install_crds()
            flux._spawn()
            yield flux
        finally:
            flux.stop()

    def _install_crds(self) -> None:
        crds = sorted((self.bin_dir / "flux-crds").glob("*.yaml"))
        args = [a for c in crds for a in ("-f", str(c))]
        self.cluster.kubectl("apply", "--server-side", *args, timeout=120)
        for c in crds:
            self.cluster.kubectl(
                "wait", "--for=condition=Established", "-f", str(c), "--timeout=60s", timeout=90
            )

    def _spawn(self) -> None:
        (self.work / "artifacts").mkdir(parents=True, exist_ok=True)
        storage = free_port()
        common = ["--enable-leader-election=false", "--watch-all-namespaces=true",
                  "--log-level=debug", "--log-encoding=console"]  # fmt: skip
        flags = {
            "flux-source-controller": [
                f"--storage-path={self.work / 'artifacts'}",
                f"--storage-addr=127.0.0.1:{storage}",
                f"--storage-adv-addr=127.0.0.1:{storage}",
                "--artifact-retention-ttl=1m",
            ],
            # a Kustomization held by a dependency looks again after 5 s (default 30 s)
            "flux-kustomize-controller": ["--no-remote-bases=true", "--requeue-dependency=5s"],
        }
        env = {
            **os.environ,
            "KUBECONFIG": self.cluster.kubeconfig,
            "RUNTIME_NAMESPACE": "flux-system",
            # Git and the artifact server are on loopback: never through a proxy
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        for name in NAMES:
            health = free_port()
            self.health[name] = health
            log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
            addrs = [f"--metrics-addr=127.0.0.1:{free_port()}", f"--health-addr=127.0.0.1:{health}"]
            self.procs[name] = subprocess.Popen(
                [str(self.bin_dir / name), *common, *flags[name], *addrs],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
        for name in NAMES:
            wait_for(lambda n=name: self._ready(n), 120, f"{name} ready", detail=self.tails)

    def _ready(self, name: str) -> bool:
        code = self.procs[name].poll()
        if code is not None:
            raise RuntimeError(f"{name} exited with {code}:\n{self.tail(name)}")
        try:
            url = f"http://127.0.0.1:{self.health[name]}/readyz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self.log(name).splitlines()[-lines:])

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n{self.tail(n)}" for n in NAMES)

    def stop(self) -> None:
        """Delete every Kustomization and GitRepository while the controllers still run (their
        finalizers are the controllers' to remove: a namespace holding one would never finish
        terminating), then SIGTERM both. A Kustomization whose reconcile is still waiting on its
        health checks (a gate's `wait: true`, up to its `timeout`) handles its deletion only
        after that wait: its finalizer is dropped after 20 s, the namespace's deletion takes the
        rest."""
        kinds = ("kustomizations.kustomize.toolkit.fluxcd.io",
                 "gitrepositories.source.toolkit.fluxcd.io")  # fmt: skip
        if self.procs and all(p.poll() is None for p in self.procs.values()):
            for kind in kinds:
                self.cluster.kubectl(
                    "delete", kind, "--all", "-A", "--wait=true", "--timeout=20s",
                    check=False, timeout=60,
                )  # fmt: skip
        for kind in kinds:
            left = self.cluster.kubectl(
                "get", kind, "-A", "-o",
                "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{'\\n'}{end}",
                check=False,
            ).stdout.split()  # fmt: skip
            for ref in left:
                ns, name = ref.split("/", 1)
                self.cluster.kubectl(
                    "patch", kind, name, "-n", ns, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False,
                )  # fmt: skip
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


# The pieces both Flux test modules share: the forge and Flux fixtures, the GitRepository,
# the examples' Kustomizations moved into a test's namespace, and Flux's readiness as read.
PATCH = "apps/sim/kvgate-fp8.patch.yaml"
FLUX_MANAGER = "kustomize-controller"  # the field manager Flux applies with


def _needed(what: str | None, message: str) -> None:
    if what is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: not skipping)", pytrace=False)
        pytest.skip(message)


@pytest.fixture(name="gitea")
def gitea_fixture(tmp_path: Path) -> Iterator[LoopbackGitea]:
    binary = gitea_binary()
    _needed(binary and str(binary), "no Gitea binary: run `make binaries` (--forge)")
    with LoopbackGitea.start(tmp_path / "gitea") as forge:
        yield forge


@pytest.fixture(name="flux")
def flux_fixture(cluster: Any, tmp_path: Path) -> Iterator[FluxControllers]:
    bin_dir = flux_bin_dir()
    _needed(bin_dir and str(bin_dir), "no Flux controllers: run `make binaries` (--flux)")
    assert bin_dir is not None
    with FluxControllers.start(cluster, tmp_path / "flux", bin_dir) as controllers:
        yield controllers


def git_repository(cluster: Any, namespace: str, gitea: LoopbackGitea, repo: str) -> dict[str, Any]:
    """A GitRepository on the Gitea repository's main branch, read with a read-only token."""
    token = gitea.admin_token_with(["read:repository"])
    cluster.kubectl(
        "create", "secret", "generic", "git-auth", "-n", namespace,
        "--from-literal=username=kvgate-admin", f"--from-literal=password={token}",
    )  # fmt: skip
    source = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "GitRepository",
        "metadata": {"name": "deploy", "namespace": namespace},
        "spec": {
            "interval": "5s",  # how soon Flux sees a merge
            "url": f"{gitea.url}/{repo}.git",
            "ref": {"branch": "main"},
            "secretRef": {"name": "git-auth"},
        },
    }
    apply(cluster, namespace, source)
    return source


def recipe(path: Path, namespace: str, renames: dict[str, str]) -> list[dict[str, Any]]:
    """An example's Kustomizations, moved into the test's namespace and repository."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = namespace
        doc["metadata"]["name"] = renames.get(doc["metadata"]["name"], doc["metadata"]["name"])
        spec = doc["spec"]
        for dep in spec.get("dependsOn") or []:
            dep["name"] = renames.get(dep["name"], dep["name"])
        spec["sourceRef"] = {"kind": "GitRepository", "name": "deploy"}
        spec["targetNamespace"] = namespace
        spec["path"] = renames.get(spec["path"], spec["path"])
        for check in spec.get("healthChecks") or []:
            check["namespace"] = namespace
            check["name"] = renames.get(check["name"], check["name"])
        out.append(doc)
    return out


KS = "kustomizations.kustomize.toolkit.fluxcd.io"


def ks_ready(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """The Kustomization's Ready condition ({} before it has one)."""
    status = (get(cluster, namespace, KS, name) or {}).get("status") or {}
    ready: dict[str, Any] = {c["type"]: c for c in status.get("conditions") or []}.get("Ready", {})
    return {**ready, "lastAppliedRevision": status.get("lastAppliedRevision")}


def kustomization_ready(cluster: Any, namespace: str, name: str, revision: str) -> bool:
    ready = ks_ready(cluster, namespace, name)
    return bool(ready.get("status") == "True" and ready["lastAppliedRevision"] == revision)


def template_writers(cluster: Any, namespace: str, name: str = "sim") -> set[str]:
    shown = cluster.kubectl(
        "get", "deployment", name, "-n", namespace, "-o", "json", "--show-managed-fields"
    )  # fmt: skip
    return {
        m["manager"]
        for m in json.loads(shown.stdout)["metadata"]["managedFields"]
        if m.get("subresource") != "status" and "f:template" in json.dumps(m.get("fieldsV1"))
    }


def recorded_pr(cluster: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The rollout's status.pullRequest once its number is recorded."""
    status = (get(cluster, namespace, "kvr", name) or {}).get("status") or {}
    pr: dict[str, Any] = status.get("pullRequest") or {}
    return pr if pr.get("number") else None


def deployment_args(cluster: Any, namespace: str, name: str) -> list[str]:
    live = get(cluster, namespace, "deployment", name) or {}
    return list(live["spec"]["template"]["spec"]["containers"][0].get("args") or [])
