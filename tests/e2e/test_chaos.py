"""Chaos: the operator is SIGKILLed at random moments while several rollouts run, and restarted.

Rollouts that promote and rollouts whose promoted pods crash (so a revert is needed) run
concurrently, so one kill strikes several of them in different phases. After every rollout
ended, the invariant must hold for each: terminal Promoted <=> the Deployment runs the
candidate; any other terminal phase <=> the Deployment's container (image, command, args,
env) equals the original. The kills, the phases they struck and the violations are printed
(and written to $KVGATE_CHAOS_REPORT when set).
"""

from __future__ import annotations

import collections
import json
import os
import random
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import (
    TERMINAL,
    Operator,
    apply,
    container_of,
    create_namespace,
    delete_namespace,
    get,
    install_crd,
    pods,
    rollout,
    send_completions,
    sim_deployment,
    wait_deployment_ready,
)

from kvgate.change.manifests import candidate_container
from kvgate.config import OperatorConfig
from kvgate.spec.rollout import RolloutSpec

pytestmark = pytest.mark.e2e

# 30 kills in `make test` (CI budget); `KVGATE_CHAOS_KILLS=100` for a longer attack.
KILLS = int(os.environ.get("KVGATE_CHAOS_KILLS") or 30)
BUDGET_S = float(os.environ.get("KVGATE_CHAOS_BUDGET") or 900)
ALLOW = OperatorConfig.from_env({"KVGATE_EXTRA_ALLOWED_ENV": "KVGATE_SIM_*"}).allowlist
GUARDED = ("image", "command", "args", "env")
TRITON = ["--attention-backend", "TRITON_ATTN"]
# Promoted pods of a "revert" rollout crash after this many requests; the eval sends the
# candidate canary fewer (30 questions an attempt), the test sends the promoted pod more.
CRASH_AFTER = 150


def _spec(kind: str) -> dict[str, Any]:
    env = [{"name": "KVGATE_SIM_FAULTS", "value": f"crash-after={CRASH_AFTER}"}]
    return {
        "extraArgs": TRITON,
        "extraEnv": env if kind == "revert" else [],
        "gates": {
            "capacity": {"mode": "off"},
            "accuracy": {"questions": 30, "chunk": 30, "margin": 10, "sequential": False},
        },
        "canary": {"startupTimeout": "120s", "evalTimeout": "240s", "evalRetries": 3},
        # Samples 10 s apart: a restarted operator (import + Lease) is back well within two
        # intervals, so the window is not restarted by every kill.
        "promotion": {"mode": "auto", "verifyWindow": "20s", "verifySamples": 3},
    }


def _guarded(container: dict[str, Any]) -> dict[str, Any]:
    return {k: container[k] for k in GUARDED if k in container}


def _crash_promoted_pods(
    cluster: Any, namespace: str, names: list[str], stop: threading.Event
) -> None:
    """Production traffic that crashes a promoted "revert" pod: sent to its loopback pod IP."""

    hit: set[str] = set()
    while not stop.is_set():
        for name in names:
            try:
                found = pods(cluster, namespace, f"app={name}")
            except Exception:  # a failed listing is retried; the thread lives on
                found = []
            for pod in found:
                ip = (pod.get("status") or {}).get("podIP")
                args = pod["spec"]["containers"][0].get("args") or []
                uid = pod["metadata"]["uid"]
                ready = any(
                    c.get("ready") for c in (pod.get("status") or {}).get("containerStatuses") or []
                )
                if uid in hit or not ip or not ready or "--kv-cache-dtype" not in args:
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                answered = send_completions(f"http://{ip}:8000/v1/completions", CRASH_AFTER + 20)
                if answered:  # it served, then stopped: the fault fired (or will on retry)
                    hit.add(uid)
        stop.wait(1.0)


def _phases(cluster: Any, namespace: str) -> dict[str, str]:
    proc = cluster.kubectl("get", "kvr", "-n", namespace, "-o", "json", check=False)
    if proc.returncode != 0:
        return {}
    return {
        i["metadata"]["name"]: (i.get("status") or {}).get("phase") or "New"
        for i in json.loads(proc.stdout).get("items") or []
    }


@pytest.mark.timeout(int(BUDGET_S) + 600)
def test_sigkill_at_random_moments_never_leaves_production_half_changed(
    cluster: Any, tmp_path: Path
) -> None:
    install_crd(cluster)
    rng = random.Random(int(os.environ.get("KVGATE_CHAOS_SEED") or 20261201))
    kills = 0
    struck: collections.Counter[str] = collections.Counter()
    outcomes: list[dict[str, Any]] = []
    violations: list[str] = []
    started = time.monotonic()
    wave = 0
    operator: Operator | None = None
    namespaces: list[str] = []
    try:
        while kills < KILLS and time.monotonic() - started < BUDGET_S:
            wave += 1
            ns = create_namespace(cluster, f"kvgate-chaos-{wave}-{secrets.token_hex(3)}")
            namespaces.append(ns)
            kinds = {f"p{wave}a": "promote", f"p{wave}b": "promote", f"r{wave}a": "revert",
                     f"r{wave}b": "revert"}  # fmt: skip
            for name in kinds:
                apply(cluster, ns, sim_deployment(name))
            for name in kinds:
                wait_deployment_ready(cluster, ns, name)
            original = {
                n: _guarded(container_of(get(cluster, ns, "deployment", n) or {})) for n in kinds
            }
            stop = threading.Event()
            hammer = threading.Thread(
                target=_crash_promoted_pods,
                args=(cluster, ns, [n for n, k in kinds.items() if k == "revert"], stop),
                daemon=True,
            )
            hammer.start()
            operator = Operator(cluster, tmp_path / f"operator-{wave}.log", namespaces=[ns]).start()
            for name, kind in kinds.items():
                apply(cluster, ns, rollout(f"{name}-fp8", name, **_spec(kind)))
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                phases = _phases(cluster, ns)
                if len(phases) == len(kinds) and set(phases.values()) <= TERMINAL:
                    break
                time.sleep(rng.uniform(2.0, 8.0))
                phases = _phases(cluster, ns)
                operator.kill()
                kills += 1
                struck.update(p for p in phases.values() if p not in TERMINAL)
                operator = Operator(
                    cluster, tmp_path / f"operator-{wave}.log", namespaces=[ns]
                ).start()
            stop.set()
            hammer.join(timeout=30)
            phases = _phases(cluster, ns)
            for name in kinds:
                obj = get(cluster, ns, "kvr", f"{name}-fp8") or {}
                status = obj.get("status") or {}
                live = _guarded(container_of(get(cluster, ns, "deployment", name) or {}))
                phase = status.get("phase")
                outcomes.append({"wave": wave, "rollout": name, "kind": kinds[name], "phase": phase,
                                 "reason": status.get("reason")})  # fmt: skip
                if phase not in TERMINAL:
                    violations.append(f"{ns}/{name}: not ended ({phase}: {status.get('message')})")
                elif phase == "Promoted":
                    # The candidate derived from the spec (status holds only fingerprints).
                    spec = RolloutSpec.from_dict(obj["spec"], allow=ALLOW)
                    dep = get(cluster, ns, "deployment", name) or {}
                    expected = _guarded(
                        candidate_container(spec, {**container_of(dep), **original[name]})
                    )
                    if live != expected:
                        violations.append(f"{ns}/{name}: Promoted but not on the candidate: {live}")
                elif live != original[name]:
                    violations.append(f"{ns}/{name}: {phase} but changed: {live}")
            # The finalizers need a live operator to let the rollouts go.
            cluster.kubectl(
                "delete", "kvr", "--all", "-n", ns, "--timeout=150s", check=False, timeout=180
            )
            operator.stop()
            operator = None
    finally:
        if operator is not None:
            for ns in namespaces:
                cluster.kubectl("delete", "kvr", "--all", "-n", ns, "--wait=false", check=False)
            time.sleep(3)
            operator.stop()
        for ns in namespaces:
            delete_namespace(cluster, ns)
    report = {
        "kills": kills,
        "waves": wave,
        "seconds": round(time.monotonic() - started),
        "phases_struck": dict(struck),
        "outcomes": collections.Counter(
            f"{o['kind']}->{o['phase']}/{o['reason']}" for o in outcomes
        ),
        "violations": violations,
    }
    print("chaos report:", json.dumps(report, indent=2))
    if os.environ.get("KVGATE_CHAOS_REPORT"):
        Path(os.environ["KVGATE_CHAOS_REPORT"]).write_text(json.dumps(report, indent=2))
    assert violations == []
    assert kills >= min(KILLS, 10), f"only {kills} kills in the budget"
    # The promoted and reverted paths were both exercised (not only early endings).
    ends = {(o["kind"], o["phase"]) for o in outcomes}
    assert ("promote", "Promoted") in ends, outcomes
    assert any(o["kind"] == "revert" and o["reason"] == "PromotionReverted" for o in outcomes), (
        outcomes
    )
    assert {"Evaluating", "Promoting", "Verifying"} <= set(struck), struck
