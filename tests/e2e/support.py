"""Helpers for the operator e2e tests: CRD install, a `kvgate run` subprocess, manifests, waits,
and `ScenarioWorld`, the setup the scenario modules share.

No tests here. The operator runs as a real subprocess (`kvgate run -A`), so a test can kill it
(SIGKILL) and start another, exactly as a crashed operator pod would be replaced.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kvgate.vocabulary import Phase

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "kvgate.io_kvcacherollouts.yaml"
CHART = ROOT / "charts/kvgate"
EXAMPLES = ROOT / "examples"
VENV_BIN = Path(sys.executable).parent
GSM8K_DIR = os.environ.get("KVGATE_GSM8K_DIR") or str(ROOT.parent / "shared" / "data" / "gsm8k")

_T = TypeVar("_T")


def wait_for(
    predicate: Callable[[], _T],
    timeout: float,
    what: str,
    interval: float = 0.5,
    detail: Callable[[], str] | None = None,
) -> _T:
    """Poll until `predicate()` is truthy; its value is returned. No fixed sleeps elsewhere.

    `detail`, when given, adds what it returns to the timeout's message (a log's tail, say).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    extra = f"\n{detail()}" if detail is not None else ""
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r}){extra}")


def install_crd(cluster: Any) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    # `kubectl wait` exits at once when it cannot read the CRD yet (seen once on a loaded machine
    # seconds after the cluster came up): wait for the condition, not for the first answer.
    wait_for(
        lambda: cluster.kubectl(
            "wait", "--for=condition=Established", "crd/kvcacherollouts.kvgate.io",
            "--timeout=10s", check=False,
        ).returncode == 0,
        60,
        "the CRD to be Established",
    )  # fmt: skip


class Helm:
    """The control plane's `helm`, with its caches and config under `home`."""

    def __init__(self, cluster: Any, home: Path) -> None:
        self.bin = str(Path(cluster.bin_dir) / "helm")
        self.env = {
            **os.environ,
            "KUBECONFIG": cluster.kubeconfig,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.bin, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )


RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Operator:
    """`kvgate run` as a subprocess with a short poll interval; its log goes to a file.

    It runs with `-A`: it watches every namespace and takes the one cluster-scope Lease, whatever
    `namespaces` (the ones its module made) says. So two modules' operators would act on each
    other's rollouts and contend for that Lease: e2e modules run one at a time per cluster
    (under pytest-xdist, `--dist loadfile`, each worker has a cluster of its own).
    """

    # Every Operator whose process may still run: tests/e2e/conftest.py kills what a module
    # leaves behind, so one module's missed stop cannot hold the Lease for the next ones.
    running: set[Operator] = set()  # noqa: RUF012 - shared on purpose

    @classmethod
    def reap(cls) -> list[Path]:
        """SIGKILL every Operator still running; the logs of those it killed."""
        leaked = [op for op in cls.running if op.proc is not None and op.proc.poll() is None]
        for op in leaked:
            op.kill()
        cls.running.clear()
        return [op.log_path for op in leaked]

    def __init__(
        self,
        cluster: Any,
        log_path: Path,
        *,
        namespaces: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        self.cluster = cluster
        self.namespaces = namespaces or []
        self.log_path = log_path
        self.metrics_port = free_port()
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    def start(self) -> Operator:
        """Start `kvgate run` and wait until it serves metrics (its startup handler ran).

        Fails at once, with the tail of its log, when the process exits first; a metrics port
        taken between `free_port()` and the operator's bind (any process on this host may get
        it as an ephemeral port) gets a fresh port and another start, not a failed test.
        """
        for _ in range(3):
            self._spawn()
            outcome = wait_for(self._started, 120, "operator metrics endpoint", detail=self.tail)
            if outcome == "serving":
                return self
            if "Address already in use" not in self._this_start():
                raise RuntimeError(f"the operator exited with {outcome}:\n{self.tail()}")
            self.metrics_port = free_port()
        raise RuntimeError(f"the operator found no free metrics port in 3 tries:\n{self.tail()}")

    def _started(self) -> str | None:
        if self.metrics() is not None:
            return "serving"
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            return f"exit code {code}"
        if "Address already in use" in self._this_start():
            self.kill()
            return "a taken metrics port"
        return None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def _this_start(self) -> str:
        """The log written since the last spawn (one log file holds every start's)."""
        return self.log()[self._log_offset :]

    def _spawn(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": self.cluster.kubeconfig,
            "KVGATE_POLL_INTERVAL": "1",
            "KVGATE_GSM8K_DIR": GSM8K_DIR,
            "KVGATE_EVAL_CONCURRENCY": "8",
            # Tests drive the simulator's fault switches through extraEnv (an operator-level
            # extension of the allowlist, as a platform team would configure it).
            "KVGATE_EXTRA_ALLOWED_ENV": "KVGATE_SIM_*",
            # The test kubelet runs pods as host processes: an emptyDir over /tmp would hide
            # the tests' own files.
            "KVGATE_EVAL_WRITABLE_TMP": "0",
            "KVGATE_DRIFT_INTERVAL": "2",
            # Local checkpoints the tests write live under the temp dir; test traffic stays on
            # loopback, so the hub is never consulted for a checkpoint named by a hub id.
            "KVGATE_MODEL_DIRS": tempfile.gettempdir(),
            "HF_HUB_OFFLINE": "1",
            # A short Lease, so a replacement for a SIGKILLed operator leads within seconds.
            "KVGATE_LEASE_DURATION": "4",
            "KVGATE_LEASE_RENEW_DEADLINE": "3",
            "KVGATE_LEASE_RETRY_PERIOD": "1",
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            **self.extra_env,
        }
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self._log_offset = len(self.log())
        self.proc = subprocess.Popen(
            [
                str(VENV_BIN / "kvgate"),
                "run",
                "-A",
                "--verbose",
                "--metrics-port",
                str(self.metrics_port),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        Operator.running.add(self)
        log.close()

    def metrics(self) -> str | None:
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
            ) as r:
                return str(r.read().decode())
        except OSError:
            return None

    def kill(self) -> None:
        """SIGKILL, as when the node or the pod dies: no cleanup, no status write."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


# Production's traffic (KVGATE_SIM_LOAD) reaches only pods with the Deployment's `app` label,
# as through a Service: kvgate's canaries copy the env but not the label, so they get none.
SERVICE_LABEL = {
    "name": "KVGATE_SIM_SERVICE_LABEL",
    "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}},
}


def start_forge_operator(
    cluster: Any, namespace: str, api_url: str, token: str, repo: str, log_path: Path
) -> Operator:
    """The forge token as the operator finds it (a labelled, annotated Secret) and an operator
    allowed to read such Secrets (KVGATE_FORGE_TOKEN_SECRETS), started; the forge on loopback."""
    cluster.kubectl("create", "secret", "generic", "forge-token", "-n", namespace,
                    f"--from-literal=token={token}")  # fmt: skip
    cluster.kubectl("label", "secret", "forge-token", "-n", namespace,
                    "kvgate.io/forge-token=true")  # fmt: skip
    cluster.kubectl("annotate", "secret", "forge-token", "-n", namespace,
                    f"kvgate.io/forge-api-url={api_url}",
                    f"kvgate.io/forge-repository={repo}")  # fmt: skip
    return Operator(
        cluster,
        log_path,
        namespaces=[namespace],
        extra_env={"KVGATE_FORGE_TOKEN_SECRETS": "1", "NO_PROXY": "127.0.0.1,localhost",
                   "no_proxy": "127.0.0.1,localhost"},
    ).start()  # fmt: skip


def pull_request_promotion(api_url: str, repo: str, path: str, deadline: str) -> dict[str, Any]:
    """spec.promotion for a pull request on the loopback Gitea, its token in forge-token."""
    return {
        "mode": "pullRequest",
        "pullRequest": {"provider": "gitea", "apiUrl": api_url, "repository": repo, "path": path,
                        "tokenSecretRef": {"name": "forge-token"}, "applyDeadline": deadline},
    }  # fmt: skip


def sim_deployment(
    name: str,
    *,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    replicas: int = 1,
    engine: str = "vllm",
) -> dict[str, Any]:
    """A Deployment running the vLLM (or SGLang) simulator as an L4 Qwen3-8B server."""
    base_env = {
        "KVGATE_SIM_GPU": "L4",
        "KVGATE_SIM_SPEED": "0.01",
        "KVGATE_GSM8K_DIR": GSM8K_DIR,
        **(env or {}),
    }
    port = 8000 if engine == "vllm" else 30000
    command = ["python", "-m", "kvgate.sim", "vllm", "serve", "Qwen/Qwen3-8B", "--port", "8000"]
    if engine == "sglang":
        command = ["python", "-m", "kvgate.sim", "sglang", "--model-path", "Qwen/Qwen3-8B"]
        command += ["--host", "0.0.0.0", "--port", "30000", "--enable-metrics"]
        args = args or ["--context-length", "8192"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "command": command,
                            "args": args or ["--max-model-len", "8192"],
                            "env": [{"name": k, "value": v} for k, v in base_env.items()]
                            + [SERVICE_LABEL],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": port},
                                "periodSeconds": 1,
                            },
                        }
                    ]
                },
            },
        },
    }


FAST_GATES: dict[str, Any] = {
    "capacity": {"mode": "require", "window": "3s", "samples": 3},
    "accuracy": {"questions": 150, "chunk": 50, "margin": 3},
}


def rollout(name: str, target: str, **spec: Any) -> dict[str, Any]:
    """A KVCacheRollout with short windows for tests; `spec` overrides top-level spec keys."""
    body: dict[str, Any] = {
        "targetRef": {"name": target, "container": "engine"},
        "gates": FAST_GATES,
        "canary": {"startupTimeout": "90s", "evalTimeout": "300s", "evalRetries": 1},
        "promotion": {"mode": "auto", "verifyWindow": "3s"},
    }
    body.update(spec)
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "KVCacheRollout",
        "metadata": {"name": name},
        "spec": body,
    }


def apply(cluster: Any, namespace: str, *objs: dict[str, Any], timeout: float = 60) -> None:
    text = yaml.safe_dump_all(list(objs))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text, timeout=timeout)


def get(cluster: Any, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def phase(cluster: Any, namespace: str, name: str) -> str | None:
    obj = get(cluster, namespace, "kvcacherollout", name) or {}
    return (obj.get("status") or {}).get("phase")


# The phases a rollout never leaves, as the operator defines them.
TERMINAL = frozenset(p.value for p in Phase if p.terminal)


def wait_phase(
    cluster: Any, namespace: str, name: str, phases: Collection[str], timeout: float
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        obj = get(cluster, namespace, "kvcacherollout", name) or {}
        return obj if (obj.get("status") or {}).get("phase") in phases else None

    try:
        return wait_for(reached, timeout, f"{name} in {sorted(phases)}", interval=1.0)
    except TimeoutError as exc:
        obj = get(cluster, namespace, "kvcacherollout", name) or {}
        raise TimeoutError(f"{exc}; status: {json.dumps(obj.get('status'))[:3000]}") from None


def rollout_events(
    cluster: Any, namespace: str, name: str, expect: Iterable[str] = (), timeout: float = 60
) -> list[tuple[str, str]]:
    """(reason, message) of each Event about the rollout, in the order posted.

    The operator posts an Event after the status patch it reports, so a test that has just read a
    phase waits (up to `timeout` s) until every reason in `expect` has arrived before it reads.
    """
    wanted = set(expect)
    deadline = time.monotonic() + timeout
    while True:
        proc = cluster.kubectl(
            "get", "events", "-n", namespace, "-o", "json",
            f"--field-selector=involvedObject.name={name},involvedObject.kind=KVCacheRollout",
        )  # fmt: skip
        items = json.loads(proc.stdout).get("items") or []
        # Timestamps have one-second resolution; the etcd revision orders the posts exactly.
        items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        events = [(e["reason"], e["message"]) for e in items]
        if wanted <= {reason for reason, _ in events} or time.monotonic() > deadline:
            return events
        time.sleep(1)


def event_reasons(cluster: Any, namespace: str, name: str, expect: Iterable[str] = ()) -> list[str]:
    return [reason for reason, _ in rollout_events(cluster, namespace, name, expect)]


def policy_binding(name: str, namespace: str) -> dict[str, Any]:
    """A ValidatingAdmissionPolicyBinding that denies what policy `name` refuses, in one namespace."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def wait_deployment_ready(cluster: Any, namespace: str, name: str, timeout: float = 90) -> None:
    cluster.kubectl(
        "rollout", "status", f"deployment/{name}", "-n", namespace, f"--timeout={int(timeout)}s",
        timeout=timeout + 10,
    )  # fmt: skip


def pods(cluster: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    proc = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return list(json.loads(proc.stdout).get("items") or [])


def create_namespace(cluster: Any, name: str) -> str:
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
        f"ServiceAccount default in {name}",
        interval=0.2,
    )
    return name


def delete_namespace(cluster: Any, name: str) -> None:
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def finish(cluster: Any, operator: Operator, namespaces: Iterable[str]) -> None:
    """A module's teardown: every rollout deleted while the operator still runs (its finalizer
    must be released), the operator stopped, the namespaces deleted; then the operator must
    have exited 0 with no traceback in its log."""
    names = list(namespaces)
    try:
        for ns in names:
            cluster.kubectl("delete", "kvr", "--all", "-n", ns, "--wait=false", check=False)
        for ns in names:
            cluster.kubectl(
                "wait", "--for=delete", "kvr", "--all", "-n", ns, "--timeout=120s", check=False
            )
    finally:
        # Whatever the waits did: a running operator would keep the cluster-scope Lease and
        # leave every later module's operator a follower.
        code = operator.stop()
    text = operator.log()
    for ns in names:
        delete_namespace(cluster, ns)
    assert no_tracebacks(text) == [], text[-5000:]
    assert code == 0, text[-3000:]


def no_tracebacks(log: str) -> list[str]:
    """Tracebacks in an operator log (there should be none)."""
    return [line for line in log.splitlines() if "Traceback" in line]


def send_completions(url: str, requests: int, *, workers: int = 1) -> int:
    """POST up to `requests` small completions to a pod's loopback URL (production traffic that
    triggers a simulated fault); returns how many were answered. With one worker it stops at
    the first failure (the engine went away)."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    body = json.dumps({"model": "Qwen/Qwen3-8B", "prompt": "Q: 2+2?\nA:", "max_tokens": 2})

    def one(_: int) -> bool:
        req = urllib.request.Request(url, body.encode(), {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    if workers == 1:
        answered = 0
        while answered < requests and one(answered):
            answered += 1
        return answered
    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(one, range(requests)))


def _meant_to_fill_the_pool(deployment: dict[str, Any]) -> bool:
    """A simulated production whose load (`KVGATE_SIM_LOAD` concurrency) is meant to fill its pool."""
    try:
        container = deployment["spec"]["template"]["spec"]["containers"][0]
    except (KeyError, IndexError, TypeError):
        return False
    load = next((e.get("value", "") for e in container.get("env") or []
                 if e.get("name") == "KVGATE_SIM_LOAD"), "")  # fmt: skip
    fields = dict(part.split("=", 1) for part in load.split(",") if "=" in part)
    return int(fields.get("concurrency", "0") or 0) >= 32


def pool_pressured(cluster: Any, namespace: str, name: str) -> bool:
    """One scrape of a production pod shows a full KV pool with requests waiting or preempted
    (anything unreadable on the way is a no, never an error: the caller's wait is advisory)."""
    import http.client

    try:
        return _pool_pressured(cluster, namespace, name)
    except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException,
            subprocess.SubprocessError):  # fmt: skip
        return False


def _pool_pressured(cluster: Any, namespace: str, name: str) -> bool:
    import urllib.request

    from kvgate.evidence.metrics import parse_metrics

    found = [p for p in pods(cluster, namespace, f"app={name}")
             if (p.get("status") or {}).get("podIP")
             and not (p["metadata"].get("labels") or {}).get("kvgate.io/rollout")]  # fmt: skip
    if not found:
        return False
    command = found[0]["spec"]["containers"][0].get("command") or []
    ports = [int(v) for k, v in itertools.pairwise(command) if k == "--port"]
    url = f"http://{found[0]['status']['podIP']}:{ports[-1] if ports else 8000}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:  # a pod address
        snap = parse_metrics(response.read().decode())
    waiting = (snap.waiting or 0) > 0 or (snap.preemptions or 0) > 0
    return (snap.kv_usage or 0.0) >= 0.9 and waiting


def wait_for_pool_pressure(cluster: Any, where: dict[str, str], budget: float = 120) -> list[str]:
    """Wait until each production (scenario -> namespace) shows pool pressure twice in a row:
    the condition a rollout's preflight samples. Returns the ones that never did within `budget`
    (their tests then see what the rollout sees; the wait only removes the start-up race)."""
    streak = dict.fromkeys(where, 0)
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline and any(n < 2 for n in streak.values()):
        for s, namespace in where.items():
            if streak[s] < 2:
                streak[s] = streak[s] + 1 if pool_pressured(cluster, namespace, s) else 0
        time.sleep(2.0)
    return [s for s, n in streak.items() if n < 2]


class ScenarioWorld:
    """Scenarios that run at once under one operator, each in its own namespace
    `kvgate-<tag>-<scenario>-<hex>`: the setup the scenario modules share.

    A module's fixture creates it (CRD installed, namespaces made, operator built but not
    started), starts the operator when its module wants, `deploy`s the Deployments (recorded
    as `before` once ready), `start_rollouts`, yields it and calls `finish` in `finally`.
    `rollout(scenario)` waits up to `settle_timeout` for a phase in `settled`.
    """

    def __init__(
        self,
        cluster: Any,
        log_dir: Path,
        tag: str,
        scenarios: Iterable[str],
        *,
        extra_env: dict[str, str] | None = None,
        settled: Collection[str] = TERMINAL,
        settle_timeout: float = 420,
    ) -> None:
        self.cluster = cluster
        self.settled, self.settle_timeout = settled, settle_timeout
        install_crd(cluster)
        suffix = secrets.token_hex(3)
        self.ns = {s: create_namespace(cluster, f"kvgate-{tag}-{s}-{suffix}") for s in scenarios}
        self.operator = Operator(
            cluster,
            log_dir / "operator.log",
            namespaces=list(self.ns.values()),
            extra_env=extra_env,
        )
        self.before: dict[str, dict[str, Any]] = {}

    def deploy(self, deployments: dict[str, dict[str, Any]]) -> None:
        """Apply each scenario's Deployment, then wait for each and record it as first applied;
        a Deployment whose simulated load should fill the pool is waited on until it does (what
        the rollout's preflight samples), not for a number of seconds."""
        for s, deployment in deployments.items():
            apply(self.cluster, self.ns[s], deployment)
        for s in deployments:
            wait_deployment_ready(self.cluster, self.ns[s], s)
            self.before[s] = self.deployment(s)
        full = {s: self.ns[s] for s, d in deployments.items() if _meant_to_fill_the_pool(d)}
        missing = wait_for_pool_pressure(self.cluster, full)
        if missing:
            print(f"pool pressure not seen within the wait: {', '.join(missing)}")

    def start_rollouts(self, specs: dict[str, dict[str, Any]]) -> None:
        """A rollout `<scenario>-fp8` of each scenario's Deployment with that spec."""
        for s, spec in specs.items():
            apply(self.cluster, self.ns[s], rollout(f"{s}-fp8", s, **spec))

    def finish(self) -> None:
        finish(self.cluster, self.operator, self.ns.values())

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.cluster.kubectl(*args, **kw)

    def rollout(self, scenario: str, name: str | None = None) -> dict[str, Any]:
        """The rollout (`<scenario>-fp8` unless named) once in a `settled` phase."""
        return wait_phase(
            self.cluster,
            self.ns[scenario],
            name or f"{scenario}-fp8",
            self.settled,
            self.settle_timeout,
        )

    def status(self, scenario: str) -> dict[str, Any]:
        obj = get(self.cluster, self.ns[scenario], "kvr", f"{scenario}-fp8") or {}
        return obj.get("status") or {}

    def deployment(self, scenario: str) -> dict[str, Any]:
        dep = get(self.cluster, self.ns[scenario], "deployment", scenario)
        assert dep is not None
        return dep
