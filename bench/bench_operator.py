"""Operator load: N KVCacheRollouts applied at once to one `kvgate run`; prints the figures.

Each rollout targets its own simulated L4 Deployment (replicas 0: the canaries come from the pod
template) and takes the L4-trap path: capacity gate off, checkpoint scan, two canary pods, the
FlashInfer candidate crashes, logs are read, rolled back, canaries deleted. That exercises every
API path except the eval Job and the Deployment patch, without an eval's CPU cost.

Figures: operator peak RSS (VmHWM), Kubernetes API requests per rollout (the operator's own
calls, counted by its adapter, plus kopf's requests on kvcacherollouts as the apiserver counted
them), and time from creation to verdict.

    .venv/bin/python bench/bench_operator.py [--rollouts 20] [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from support import (  # noqa: E402
    Operator,
    apply,
    create_namespace,
    install_crd,
    rollout,
    sim_deployment,
    wait_for,
)

from cluster import Cluster, default_bin_dir, missing_binaries  # noqa: E402

TERMINAL = {"Promoted", "RolledBack", "NotNeeded", "Failed"}


def _apiserver_requests(cluster: Cluster, resource: str) -> dict[str, float]:
    """apiserver_request_total by verb for one resource (all clients)."""
    text = cluster.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{") or f'resource="{resource}"' not in line:
            continue
        verb = re.search(r'verb="([A-Z]+)"', line)
        if verb:
            out[verb.group(1)] = out.get(verb.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _operator_requests_by_verb(metrics: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("kvgate_api_requests_total{"):
            verb = re.search(r'verb="([a-z_]+)"', line)
            resource = re.search(r'resource="([a-z_]+)"', line)
            key = f"{verb.group(1) if verb else '?'} {resource.group(1) if resource else '?'}"
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _operator_requests(metrics: str) -> float:
    return sum(_operator_requests_by_verb(metrics).values())


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    missing = missing_binaries(default_bin_dir())
    if missing:
        print(
            f"bench_operator: control-plane binaries missing ({', '.join(missing)}); run make binaries"
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-") as tmp:
        cluster = Cluster(Path(tmp) / "cluster", bin_dir=default_bin_dir())
        cluster.start(timeout=300)
        operator: Operator | None = None
        try:
            install_crd(cluster)
            ns = create_namespace(cluster, "bench")
            operator = Operator(cluster, Path(tmp) / "operator.log", namespaces=[ns])
            operator.start()
            assert operator.proc is not None
            names = [f"r{i:02d}" for i in range(args.rollouts)]
            deployments = []
            for n in names:
                dep = sim_deployment(n)
                dep["spec"]["replicas"] = 0
                deployments.append(dep)
            apply(cluster, ns, *deployments, timeout=300)
            by_verb_before = _operator_requests_by_verb(operator.metrics() or "")
            requests_before = sum(by_verb_before.values())
            crs_before = _apiserver_requests(cluster, "kvcacherollouts")
            spec = {"gates": {"capacity": {"mode": "off"}}}
            started = time.monotonic()
            # In batches: one kubectl apply of 100 objects can outlast its 60 s on a busy machine
            # while the operator already reacts to the first ones.
            for i in range(0, len(names), 10):
                batch = [rollout(f"{n}-fp8", n, **spec) for n in names[i : i + 10]]
                apply(cluster, ns, *batch, timeout=300)

            def finished() -> list[dict] | None:
                items = json.loads(cluster.kubectl("get", "kvr", "-n", ns, "-o", "json").stdout)[
                    "items"
                ]
                done = [i for i in items if (i.get("status") or {}).get("phase") in TERMINAL]
                return items if len(done) == len(names) else None

            items = wait_for(finished, args.timeout, f"{len(names)} verdicts", interval=2.0)
            wall = time.monotonic() - started
            # Let the terminal cleanups (canary deletes, report ConfigMaps) finish before counting.
            wait_for(
                lambda: (
                    not json.loads(
                        cluster.kubectl(
                            "get", "pods", "-n", ns, "-l", "kvgate.io/rollout", "-o", "json"
                        ).stdout
                    )["items"]
                ),
                120,
                "canaries deleted",
                interval=2.0,
            )
            metrics = operator.metrics() or ""
            own = _operator_requests(metrics) - requests_before
            crs_after = _apiserver_requests(cluster, "kvcacherollouts")
            # kopf writes status and its progress annotations with PATCH; the GETs and POSTs on
            # this resource are the bench's own `kubectl apply`.
            kopf_patches = crs_after.get("PATCH", 0.0) - crs_before.get("PATCH", 0.0)
            to_verdict = [
                (
                    _time(i["status"]["finishedAt"]) - _time(i["metadata"]["creationTimestamp"])
                ).total_seconds()
                for i in items
            ]
            phases: dict[str, int] = {}
            for i in items:
                phases[i["status"]["phase"]] = phases.get(i["status"]["phase"], 0) + 1
            peak = _peak_rss_mib(operator.proc.pid)
            n = len(names)
            print(f"bench_operator: {n} rollouts applied at once (L4-trap path, capacity gate off)")
            print(f"  outcomes                      {phases}")
            print(f"  wall time to the last verdict {wall:.1f} s")
            print(
                "  time to verdict per rollout   "
                f"min {min(to_verdict):.0f} s, median {statistics.median(to_verdict):.0f} s, "
                f"max {max(to_verdict):.0f} s (1 s resolution)"
            )
            print(f"  operator peak RSS             {peak:.1f} MiB")
            print(f"  operator API calls (adapter)  {own:.0f} total, {own / n:.1f} per rollout")
            by_verb = _operator_requests_by_verb(metrics)
            print(
                "  adapter calls by verb and resource, per rollout "
                + ", ".join(
                    f"{v} {(c - by_verb_before.get(v, 0.0)) / n:.1f}"
                    for v, c in sorted(by_verb.items())
                    if c > by_verb_before.get(v, 0.0)
                )
            )
            print(
                f"  kopf PATCHes of the rollouts  {kopf_patches:.0f} total, "
                f"{kopf_patches / n:.1f} per rollout (status and progress annotations)"
            )
            print(
                f"  API requests per rollout      {(own + kopf_patches) / n:.1f} (watches not counted)"
            )
        finally:
            if operator is not None:
                operator.stop()
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
