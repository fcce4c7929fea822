"""A test kubelet that runs each pod's containers as local processes.

It registers a Ready Node, renews its Lease, and for every pod bound to the node:

- gives the pod a unique loopback IP (127.x.y.z, never 127.0.0.1) as status.podIP
  and in the POD_IP variable, so a client reaches a pod at podIP:port as in a real
  cluster (the whole of 127.0.0.0/8 is routed to `lo` on Linux);
- runs each container's `command` + `args` (the image is ignored) as its own
  process group, in the pod's directory, with the container's env resolved
  (literal values with $(VAR) expansion, fieldRef, secretKeyRef, configMapKeyRef,
  envFrom) and PATH starting with the bin dir of the Python running this kubelet;
- runs startup, liveness and readiness probes (httpGet, tcpSocket, exec);
- honours restartPolicy with back-off (CrashLoopBackOff, restartCount, lastState),
  runs init containers in order, completes Job pods as Succeeded or Failed;
- on deletion sends SIGTERM, waits the grace period, SIGKILLs, reports the final
  status and deletes the pod object (grace 0, UID precondition);
- serves /containerLogs over TLS so `kubectl logs` works (follow, tailLines,
  previous, timestamps, sinceSeconds, sinceTime, limitBytes). Logs are kept on
  disk per container and per restart under --root-dir.

Volumes (emptyDir, configMap, secret, downwardAPI, projected incl. the
ServiceAccount token, hostPath) are written under the pod dir and bind-mounted at
their mountPath in a private mount namespace per container (`unshare --mount`;
needs root, else --no-volumes behaviour), so in-cluster clients find
/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace} and reach
the apiserver via KUBERNETES_SERVICE_HOST/PORT. Everything else is the host
filesystem.

Not supported: exec/attach/port-forward, resource limits, Services' cluster IPs,
grpc probes (treated as tcpSocket on the port).

Run by hack/cluster.py; by hand:
    python hack/kubelet.py --kubeconfig K --node-name N --port P --tls-cert C --tls-key K --root-dir D
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import datetime as dt
import http.server
import json
import logging
import os
import random
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

log = logging.getLogger("kubelet")

KUBELET_VERSION = "v1.37.2"
LEASE_SECONDS = 40
LEASE_RENEW_SECONDS = 10
NODE_STATUS_SECONDS = 30
TICK_SECONDS = 0.2
# After this long running fine, a container's back-off starts again from the base.
BACKOFF_RESET_SECONDS = 600
_PR_SET_PDEATHSIG = 1
# Variables a pod process inherits from the kubelet's environment (a real
# container inherits nothing; these make the host's caches and settings visible).
PASS_ENV = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SSL_CERT_FILE", "USER")
PASS_ENV_PREFIXES = ("KVGATE_", "HF_", "TRANSFORMERS_")


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ts_nano() -> str:
    ns = time.time_ns()
    base = dt.datetime.fromtimestamp(ns // 1_000_000_000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{ns % 1_000_000_000:09d}Z"


def parse_ts(value: str) -> float:
    """RFC3339 (any fraction) to epoch seconds."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", value)
    if not m:
        raise ValueError(f"bad timestamp {value!r}")
    base = dt.datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    frac = float("0." + m.group(2)) if m.group(2) else 0.0
    return base.timestamp() + frac


def die_with_parent(sig: int = signal.SIGKILL) -> Any:
    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() == 1:
            os.kill(os.getpid(), sig)

    return preexec


# --- API access ------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class Api:
    """Minimal JSON client for the apiserver, from an admin kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"]
        self._ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self._ssl.load_cert_chain(user["client-certificate"], user["client-key"])
        self._client = self._new_client()
        self._lock = threading.Lock()

    def _new_client(self, read_timeout: float | None = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.server,
            verify=self._ssl,
            timeout=httpx.Timeout(30.0, read=read_timeout),
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        content = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        resp = self._client.request(method, path, content=content, params=params, headers=headers)
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, resp.text)
        return resp.json() if resp.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def watch(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        params = {**params, "watch": "true"}
        with (
            self._new_client(read_timeout=None) as client,
            client.stream("GET", path, params=params) as resp,
        ):
            if resp.status_code >= 400:
                resp.read()
                raise ApiError(resp.status_code, resp.text)
            for line in resp.iter_lines():
                if line.strip():
                    yield json.loads(line)


# --- containers ------------------------------------------------------------------


class EnvError(Exception):
    """A referenced Secret/ConfigMap/key is missing: CreateContainerConfigError."""


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: known vars substituted, $$ escapes, unknown kept."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(repl, value)


class Probe:
    def __init__(self, kind: str, spec: dict[str, Any], started: float) -> None:
        self.kind = kind
        self.spec = spec
        self.period = float(spec.get("periodSeconds", 10))
        self.timeout = float(spec.get("timeoutSeconds", 1))
        self.success_threshold = int(spec.get("successThreshold", 1))
        self.failure_threshold = int(spec.get("failureThreshold", 3))
        self.next_due = started + float(spec.get("initialDelaySeconds", 0))
        self.successes = 0
        self.failures = 0
        self.message = ""


class Container:
    """One container of a pod across its restarts."""

    def __init__(self, spec: dict[str, Any], init: bool, log_dir: Path) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.log_dir = log_dir / self.name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pump: threading.Thread | None = None
        self.instances = 0  # instances started so far; instance i logs to <i>.log
        self.current: int | None = None  # instance shown in `state` (running/terminated)
        self.previous: int | None = None  # instance shown in `lastState`
        self.open_logs: set[int] = set()
        self.restart_count = 0
        self.crashes_in_row = 0
        self.container_id = ""
        self.started_at = ""
        self.started_mono = 0.0
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.final = False  # terminated and will not be restarted
        self.backoff_until = 0.0
        self.ready = False
        self.started = False
        self.probes: dict[str, Probe] = {}
        self.kill_reason = ""
        self.env: dict[str, str] = {}
        self.mounted = False  # runs in its own mount namespace with the pod's volumes

    def log_path(self, instance: int) -> Path:
        return self.log_dir / f"{instance}.log"

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])

    def status(self) -> dict[str, Any]:
        image = self.spec.get("image", "")
        return {
            "name": self.name,
            "image": image,
            "imageID": f"kvgate-local://{image}",
            "containerID": self.container_id or None,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }


def _pump_log(stream: Any, path: Path, container: Container, instance: int) -> None:
    """Copy a process's output to its log file, one timestamped line at a time."""
    with open(path, "ab", buffering=0) as out:
        try:
            for line in iter(stream.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                out.write(ts_nano().encode() + b" " + line)
        finally:
            stream.close()
            container.open_logs.discard(instance)


# --- pods --------------------------------------------------------------------------


class PodWorker(threading.Thread):
    """Owns one pod: starts, probes, restarts and stops its containers, reports status."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kubelet = kubelet
        self.api = kubelet.api
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.pod = pod
        self.gone = False
        self.wake = threading.Event()
        self.dir = kubelet.root / "pods" / f"{self.ns}_{self.pod_name}_{self.uid}"
        (self.dir / "work").mkdir(parents=True, exist_ok=True)
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.init_containers = [
            Container(c, True, self.dir / "logs") for c in spec.get("initContainers") or []
        ]
        self.containers = [Container(c, False, self.dir / "logs") for c in spec["containers"]]
        self.pod_ip = kubelet.allocate_ip(pod)
        self.start_time = (pod.get("status") or {}).get("startTime") or now_rfc3339()
        self.phase = "Pending"
        self.transitions: dict[str, tuple[str, str]] = {}
        self.last_sent: dict[str, Any] | None = None
        self.last_error = ""
        self.stopping = False
        self.volumes: dict[str, Path] | None = None

    # -- called from other threads --

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.wake.set()

    def mark_gone(self) -> None:
        self.gone = True
        self.wake.set()

    def find(self, name: str) -> Container | None:
        for c in (*self.containers, *self.init_containers):
            if c.name == name:
                return c
        return None

    # -- the loop --

    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("pod %s/%s: worker failed", self.ns, self.pod_name)
            self.kill_all(2)
        finally:
            self.kubelet.worker_done(self)

    def _run(self) -> None:
        log.info("pod %s/%s: starting on %s", self.ns, self.pod_name, self.pod_ip)
        while True:
            if self.gone or self.kubelet.stopping.is_set():
                self.kill_all(2 if self.gone else 3)
                return
            if self.pod["metadata"].get("deletionTimestamp"):
                self.terminate()
                return
            if self.phase not in ("Succeeded", "Failed"):
                self.step()
            self.sync_status()
            self.wake.wait(TICK_SECONDS)
            self.wake.clear()

    def step(self) -> None:
        for c in self.init_containers:
            if c.final and c.exit_code == 0:
                continue
            self.advance(c)
            if c.final and c.exit_code != 0:
                self.phase = "Failed"
            return  # init containers run one at a time, before the others
        for c in self.containers:
            self.advance(c)
        if self.phase == "Pending" and any(c.instances for c in self.containers):
            self.phase = "Running"
        if all(c.final for c in self.containers):
            failed = any(c.exit_code != 0 for c in self.containers)
            self.phase = "Failed" if failed else "Succeeded"
            log.info("pod %s/%s: %s", self.ns, self.pod_name, self.phase)

    def advance(self, c: Container) -> None:
        now = time.monotonic()
        if c.proc is None:
            if c.final or now < c.backoff_until:
                return
            self.start_container(c)
            return
        rc = c.proc.poll()
        if rc is None:
            self.probe(c, now)
            return
        self.on_exit(c, rc)

    def start_container(self, c: Container) -> None:
        try:
            c.env = self.kubelet.container_env(self, c.spec)
            if self.volumes is None:
                self.volumes = self.prepare_volumes()
        except (EnvError, ApiError) as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.backoff_until = time.monotonic() + 2
            return
        argv = [
            expand(a, c.env) for a in (c.spec.get("command") or []) + (c.spec.get("args") or [])
        ]
        instance = c.instances
        started_at = now_rfc3339()
        cid = uuid.uuid4().hex
        if not argv:
            self.record_start_failure(
                c, instance, cid, started_at, "no command: the test kubelet ignores images, so "
                "the container must set `command`",
            )  # fmt: skip
            return
        cwd = c.spec.get("workingDir") or str(self.dir / "work")
        c.mounted = False
        mounts = self.container_mounts(c)
        if mounts:
            argv = mount_wrapper(mounts, argv)
            c.mounted = True
        try:
            proc = subprocess.Popen(
                argv,
                env=c.env,
                cwd=cwd if Path(cwd).is_dir() else str(self.dir / "work"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        except OSError as exc:
            self.record_start_failure(c, instance, cid, started_at, f"exec {argv[0]}: {exc}")
            return
        # Like the real kubelet, restartCount counts instances actually restarted.
        c.restart_count = instance
        c.instances += 1
        c.current = instance
        c.open_logs.add(instance)
        assert proc.stdout is not None
        c.pump = threading.Thread(
            target=_pump_log,
            args=(proc.stdout, c.log_path(instance), c, instance),
            name=f"log-{self.pod_name}-{c.name}-{instance}",
            daemon=True,
        )
        c.pump.start()
        c.proc = proc
        c.container_id = f"kvgate://{cid}"
        c.started_at = started_at
        c.started_mono = time.monotonic()
        c.state = {"running": {"startedAt": started_at}}
        c.kill_reason = ""
        c.probes = {
            kind: Probe(kind, c.spec[f"{kind}Probe"], c.started_mono)
            for kind in ("startup", "liveness", "readiness")
            if c.spec.get(f"{kind}Probe")
        }
        c.started = "startup" not in c.probes
        c.ready = c.started and "readiness" not in c.probes
        self.kubelet.record_pgid(proc.pid)
        log.info(
            "pod %s/%s: container %s started (pid %d): %s",
            self.ns, self.pod_name, c.name, proc.pid, " ".join(argv),
        )  # fmt: skip

    def record_start_failure(
        self, c: Container, instance: int, cid: str, started_at: str, message: str
    ) -> None:
        c.restart_count = instance
        c.instances += 1
        c.current = instance
        c.log_path(instance).write_text(f"{ts_nano()} {message}\n")
        c.container_id = f"kvgate://{cid}"
        c.started_at = started_at
        c.started_mono = time.monotonic()
        c.kill_reason = "StartError"
        self.after_exit(c, 128, message)

    def on_exit(self, c: Container, rc: int) -> None:
        assert c.proc is not None
        pid = c.proc.pid
        # Children left in the group would keep the log pipe open.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        self.kubelet.forget_pgid(pid)
        if c.pump is not None:
            c.pump.join(timeout=2)
        c.proc = None
        self.after_exit(c, 128 - rc if rc < 0 else rc, "")

    def after_exit(self, c: Container, code: int, message: str) -> None:
        finished = now_rfc3339()
        reason = c.kill_reason or ("Completed" if code == 0 else "Error")
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": c.started_at,
            "finishedAt": finished,
            "containerID": c.container_id,
        }
        if code > 128:
            term["signal"] = code - 128
        if message:
            term["message"] = message
        c.ready = False
        c.started = False
        policy = self.restart_policy
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if c.init and policy != "Never":
            restart = code != 0  # init containers restart on failure only
        if self.kubelet.stopping.is_set() or self.pod["metadata"].get("deletionTimestamp"):
            restart = False
        log.info(
            "pod %s/%s: container %s exited %d (%s)%s",
            self.ns, self.pod_name, c.name, code, reason, ", restarting" if restart else "",
        )  # fmt: skip
        if not restart:
            c.state = {"terminated": term}
            c.final = True
            return
        if time.monotonic() - c.started_mono > BACKOFF_RESET_SECONDS:
            c.crashes_in_row = 0
        # Like the real kubelet: the first restart is immediate, then base, 2*base, ... cap.
        delay = 0.0
        if c.crashes_in_row > 0:
            delay = min(
                self.kubelet.backoff_base * 2 ** (c.crashes_in_row - 1), self.kubelet.backoff_cap
            )
        c.crashes_in_row += 1
        c.last_state = {"terminated": term}
        c.previous = c.current
        c.backoff_until = time.monotonic() + delay
        if delay > 0:
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay:g}s restarting failed container={c.name} "
                    f"pod={self.pod_name}_{self.ns}({self.uid})",
                }
            }
        else:
            c.state = {"waiting": {"reason": "ContainerCreating"}}

    # -- volumes --

    def prepare_volumes(self) -> dict[str, Path]:
        """Materialise the pod's volumes as directories under the pod dir (once per pod)."""
        paths: dict[str, Path] = {}
        for vol in self.pod["spec"].get("volumes") or []:
            name = vol["name"]
            if "hostPath" in vol:
                paths[name] = Path(vol["hostPath"]["path"])
                continue
            d = self.dir / "volumes" / name
            d.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol or "secret" in vol:
                self.write_source(d, vol)
            elif "downwardAPI" in vol:
                self.write_downward(d, vol["downwardAPI"].get("items") or [])
            elif "projected" in vol:
                for source in vol["projected"].get("sources") or []:
                    self.write_source(d, source)
            # emptyDir and anything else: an empty directory shared by the pod's containers.
            paths[name] = d
        return paths

    def write_source(self, d: Path, source: dict[str, Any]) -> None:
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            sa = self.pod["spec"].get("serviceAccountName") or "default"
            spec: dict[str, Any] = {
                "expirationSeconds": int(sat.get("expirationSeconds", 3607)),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.pod_name,
                    "uid": self.uid,
                },
            }
            if sat.get("audience"):
                spec["audiences"] = [sat["audience"]]
            resp = self.api.request(
                "POST",
                f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
            )
            write_file(d / sat["path"], resp["status"]["token"])
            return
        if "downwardAPI" in source:
            self.write_downward(d, source["downwardAPI"].get("items") or [])
            return
        for key, kind, name_field in (
            ("configMap", "configmaps", "name"),
            ("secret", "secrets", "secretName"),
        ):
            if key not in source:
                continue
            ref = source[key]
            name = ref.get(name_field) or ref.get("name")
            data = self.kubelet.config_data(kind, self.ns, name, ref.get("optional", False))
            items = ref.get("items")
            if items:
                for item in items:
                    if item["key"] in data:
                        write_file(d / item["path"], data[item["key"]])
                    elif not item.get("optional", ref.get("optional", False)):
                        raise EnvError(
                            f"couldn't find key {item['key']} in {kind[:-1]} {self.ns}/{name}"
                        )
            else:
                for k, v in data.items():
                    write_file(d / k, v)

    def write_downward(self, d: Path, items: list[dict[str, Any]]) -> None:
        for item in items:
            if "fieldRef" in item:
                value = self.kubelet.env_value(self, {}, {"fieldRef": item["fieldRef"]})
            else:
                value = self.kubelet.env_value(
                    self, {}, {"resourceFieldRef": item["resourceFieldRef"]}
                )
            write_file(d / item["path"], value or "")

    def container_mounts(self, c: Container) -> list[tuple[str, str, bool]]:
        """(source on the host, mountPath, readOnly) for each of the container's volumeMounts."""
        if not self.kubelet.can_mount:
            return []
        mounts = []
        for vm in c.spec.get("volumeMounts") or []:
            base = (self.volumes or {}).get(vm["name"])
            if base is None:
                continue
            src = base / vm["subPath"] if vm.get("subPath") else base
            if vm.get("subPath") and not src.exists():
                src.mkdir(parents=True, exist_ok=True)
            if str(src) != vm["mountPath"]:
                mounts.append((str(src), vm["mountPath"], bool(vm.get("readOnly"))))
        return mounts

    # -- probes --

    def probe(self, c: Container, now: float) -> None:
        kinds = ["startup"] if not c.started else ["liveness", "readiness"]
        for kind in kinds:
            p = c.probes.get(kind)
            if p is None or now < p.next_due:
                continue
            ok, message = self.run_probe(c, p)
            p.next_due = time.monotonic() + p.period
            if ok:
                p.successes += 1
                p.failures = 0
            else:
                p.failures += 1
                p.successes = 0
                p.message = message
            if kind == "startup":
                if ok:
                    c.started = True
                    c.ready = "readiness" not in c.probes
                    now_m = time.monotonic()
                    for other in ("liveness", "readiness"):
                        if other in c.probes:
                            c.probes[other].next_due = max(c.probes[other].next_due, now_m)
                elif p.failures >= p.failure_threshold:
                    self.kill_for_probe(c, "Startup", message)
                    return
            elif kind == "liveness":
                if not ok and p.failures >= p.failure_threshold:
                    self.kill_for_probe(c, "Liveness", message)
                    return
            elif kind == "readiness":
                if ok and p.successes >= p.success_threshold:
                    c.ready = True
                elif not ok and p.failures >= p.failure_threshold:
                    c.ready = False

    def kill_for_probe(self, c: Container, what: str, message: str) -> None:
        log.info(
            "pod %s/%s: %s probe failed for %s: %s", self.ns, self.pod_name, what, c.name, message
        )
        spec = c.probes[what.lower()].spec
        grace = spec.get(
            "terminationGracePeriodSeconds",
            self.pod["spec"].get("terminationGracePeriodSeconds", 30),
        )
        assert c.proc is not None
        proc = c.proc
        stop_process(proc, min(float(grace), 30.0))
        c.kill_reason = "Error"
        self.on_exit(c, proc.returncode if proc.returncode is not None else -9)

    def run_probe(self, c: Container, p: Probe) -> tuple[bool, str]:
        spec = p.spec
        try:
            if "exec" in spec:
                cmd = spec["exec"].get("command") or []
                argv = list(cmd)
                if c.mounted and c.proc is not None:
                    argv = ["nsenter", f"--mount=/proc/{c.proc.pid}/ns/mnt", "--", *argv]
                r = subprocess.run(
                    argv,
                    env=c.env,
                    cwd=str(self.dir / "work"),
                    capture_output=True,
                    timeout=p.timeout,
                    check=False,
                )
                out = (r.stdout + r.stderr).decode(errors="replace").strip()
                return r.returncode == 0, f"exec {cmd}: exit {r.returncode}: {out[:200]}"
            if "httpGet" in spec:
                hg = spec["httpGet"]
                host = hg.get("host") or self.pod_ip
                port = self.resolve_port(c, hg.get("port"))
                scheme = hg.get("scheme", "HTTP").lower()
                path = hg.get("path", "/")
                headers = {h["name"]: h["value"] for h in hg.get("httpHeaders") or []}
                url = f"{scheme}://{host}:{port}{path if path.startswith('/') else '/' + path}"
                r2 = httpx.get(url, headers=headers, timeout=p.timeout, verify=False)
                return (
                    200 <= r2.status_code < 400,
                    f"HTTP probe failed with statuscode: {r2.status_code}",
                )
            target = spec.get("tcpSocket") or spec.get("grpc") or {}
            host = target.get("host") or self.pod_ip
            port = self.resolve_port(c, target.get("port"))
            with socket.create_connection((host, port), timeout=p.timeout):
                return True, ""
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"

    def resolve_port(self, c: Container, port: Any) -> int:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for cp in c.spec.get("ports") or []:
            if cp.get("name") == port:
                return int(cp["containerPort"])
        raise ValueError(f"port {port!r} not found in container {c.name}")

    # -- stopping --

    def kill_all(self, grace: float) -> None:
        self.stopping = True
        running = [c for c in (*self.init_containers, *self.containers) if c.proc is not None]
        for c in running:
            assert c.proc is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in running:
            assert c.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for c in running:
            assert c.proc is not None
            rc = c.proc.poll()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)
            if rc is None:
                c.proc.wait()
            self.on_exit(c, c.proc.returncode)

    def terminate(self) -> None:
        """Graceful deletion: stop the processes, report, delete the pod (grace 0)."""
        meta = self.pod["metadata"]
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)
        log.info("pod %s/%s: deleting (grace %gs)", self.ns, self.pod_name, grace)
        self.kill_all(grace)
        for c in (*self.init_containers, *self.containers):
            if not c.final and c.instances == 0:
                c.state = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "ContainerStatusUnknown",
                        "message": "never started",
                    }
                }
                c.final = True
        if self.phase not in ("Succeeded", "Failed"):
            done = [c for c in self.containers if c.final]
            self.phase = "Succeeded" if done and all(c.exit_code == 0 for c in done) else "Failed"
        with contextlib.suppress(ApiError, httpx.HTTPError):
            self.sync_status()
        try:
            self.api.request(
                "DELETE",
                f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s/%s: delete failed: %s", self.ns, self.pod_name, exc)

    # -- status --

    def condition(self, ctype: str, status: bool, reason: str = "") -> dict[str, Any]:
        value = "True" if status else "False"
        prev = self.transitions.get(ctype)
        if prev is None or prev[0] != value:
            prev = (value, now_rfc3339())
            self.transitions[ctype] = prev
        cond: dict[str, Any] = {
            "type": ctype,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": prev[1],
        }
        if reason:
            cond["reason"] = reason
        return cond

    def build_status(self) -> dict[str, Any]:
        terminal = self.phase in ("Succeeded", "Failed")
        inited = all(c.final and c.exit_code == 0 for c in self.init_containers)
        all_ready = inited and all(c.ready for c in self.containers) and not terminal
        not_ready = "PodCompleted" if terminal else ("ContainersNotReady" if not all_ready else "")
        ours = [
            self.condition("PodReadyToStartContainers", not terminal or self.phase == "Succeeded"),
            self.condition("Initialized", inited, "" if inited else "ContainersNotInitialized"),
            self.condition("ContainersReady", all_ready, not_ready),
            self.condition("Ready", all_ready, not_ready),
        ]
        ours_types = {c["type"] for c in ours}
        existing = (self.pod.get("status") or {}).get("conditions") or []
        conditions = [c for c in existing if c.get("type") not in ours_types] + ours
        status: dict[str, Any] = {
            "phase": self.phase,
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        return status

    def sync_status(self) -> None:
        status = self.build_status()
        if status == self.last_sent:
            return
        try:
            pod = self.api.patch(
                f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}/status", {"status": status}
            )
        except ApiError as exc:
            if exc.status == 404:
                self.gone = True
                return
            if str(exc) != self.last_error:
                log.warning("pod %s/%s: status update failed: %s", self.ns, self.pod_name, exc)
                self.last_error = str(exc)
            return
        except httpx.HTTPError as exc:
            log.warning("pod %s/%s: status update failed: %s", self.ns, self.pod_name, exc)
            return
        self.last_sent = status
        if pod and pod["metadata"].get("uid") == self.uid:
            self.pod = pod


def write_file(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


def mount_wrapper(mounts: list[tuple[str, str, bool]], argv: list[str]) -> list[str]:
    """Run argv in a private mount namespace with each volume bind-mounted at its
    mountPath, so paths such as /var/run/secrets/kubernetes.io/serviceaccount/token
    (read by in-cluster clients) are what they are in a real pod. Needs root."""
    lines = ["set -e"]

    def shadows_a_source(target: str) -> bool:
        # A mount over /tmp would hide every later source under /tmp (pytest's state dirs).
        return any(Path(src).is_relative_to(target) for src, _, _ in mounts)

    ordered = sorted(mounts, key=lambda m: (shadows_a_source(m[1]), len(Path(m[1]).parts)))
    for src, target, read_only in ordered:
        s, t = shlex.quote(src), shlex.quote(target)
        # A file (configMap key via subPath) needs a file to mount over.
        lines.append(
            f"if [ -d {s} ]; then mkdir -p {t}; else mkdir -p $(dirname {t}); [ -e {t} ] || : > {t}; fi"
        )
        lines.append(f"mount --bind {s} {t}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {t} || true")
    lines.append('exec "$@"')
    script = "\n".join(lines)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        script,
        "sh",
        *argv,
    ]


def stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- the kubelet -------------------------------------------------------------------


class Kubelet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.api = Api(args.kubeconfig)
        self.node = args.node_name
        self.port = args.port
        self.root = Path(args.root_dir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.backoff_base = args.backoff_base
        self.backoff_cap = args.backoff_cap
        self.stopping = threading.Event()
        self.workers: dict[str, PodWorker] = {}
        self.by_name: dict[tuple[str, str], PodWorker] = {}
        self.lock = threading.Lock()
        # A random second octet keeps two local clusters' pod IPs apart; clusters started side
        # by side (one per pytest-xdist worker) get disjoint ranges, so they never share one.
        self.ip_prefix = random.randint(*args.ip_prefixes)
        self.next_ip = 2
        self.used_ips: set[str] = set()
        self.bin_dir = str(Path(sys.executable).parent)
        self.node_uid = ""
        self.pgids: set[int] = set()
        self.tls_cert = args.tls_cert
        self.tls_key = args.tls_key
        self.apiserver_port = urllib.parse.urlsplit(self.api.server).port or 443
        self.can_mount = args.volumes and self._probe_mount_namespaces()

    @staticmethod
    def _probe_mount_namespaces() -> bool:
        try:
            r = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "--", "true"],
                capture_output=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        if r.returncode != 0:
            log.warning(
                "no mount namespaces (%s): volumes are not mounted", r.stderr.decode().strip()
            )
        return r.returncode == 0

    # -- pod IPs and pgids --

    def allocate_ip(self, pod: dict[str, Any]) -> str:
        with self.lock:
            existing = (pod.get("status") or {}).get("podIP") or ""
            if existing.startswith("127.") and existing not in self.used_ips:
                self.used_ips.add(existing)
                return existing
            while True:
                n = self.next_ip
                self.next_ip += 1
                ip = f"127.{self.ip_prefix}.{(n >> 8) & 255}.{n & 255}"
                if n & 255 not in (0, 255) and ip not in self.used_ips:
                    self.used_ips.add(ip)
                    return ip

    def record_pgid(self, pid: int) -> None:
        with self.lock:
            self.pgids.add(pid)
            self._write_pgids()

    def forget_pgid(self, pid: int) -> None:
        with self.lock:
            self.pgids.discard(pid)
            self._write_pgids()

    def _write_pgids(self) -> None:
        # hack/cluster.py down kills these if the kubelet itself was killed.
        (self.root / "pgids").write_text("".join(f"{p}\n" for p in sorted(self.pgids)))

    # -- env --

    def container_env(self, worker: PodWorker, spec: dict[str, Any]) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if k in PASS_ENV or k.startswith(PASS_ENV_PREFIXES)
        }
        env["PATH"] = f"{self.bin_dir}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
        env["HOSTNAME"] = worker.pod_name
        env["POD_IP"] = worker.pod_ip
        env["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"
        env["KUBERNETES_SERVICE_PORT"] = str(self.apiserver_port)
        ns = worker.ns
        for src in spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                ref = src["configMapRef"]
                data = self.config_data("configmaps", ns, ref["name"], ref.get("optional", False))
            else:
                ref = src["secretRef"]
                data = self.config_data("secrets", ns, ref["name"], ref.get("optional", False))
            env.update({prefix + k: v for k, v in data.items()})
        for var in spec.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                env[name] = expand(var.get("value", ""), env)
                continue
            value = self.env_value(worker, spec, var["valueFrom"])
            if value is not None:
                env[name] = value
        return env

    def config_data(self, kind: str, ns: str, name: str, optional: bool) -> dict[str, str]:
        obj = self.api.get_or_none(f"/api/v1/namespaces/{ns}/{kind}/{name}")
        if obj is None:
            if optional:
                return {}
            raise EnvError(f'{kind[:-1]} "{name}" not found')
        data = dict(obj.get("data") or {})
        if kind == "secrets":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        data.update(
            {
                k: base64.b64decode(v).decode(errors="replace")
                for k, v in (obj.get("binaryData") or {}).items()
            }
        )
        return data

    def env_value(self, worker: PodWorker, spec: dict[str, Any], src: dict[str, Any]) -> str | None:
        pod = worker.pod
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            m = re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path)
            if m:
                return (pod["metadata"].get(m.group(1)) or {}).get(m.group(2), "")
            values = {
                "metadata.name": worker.pod_name,
                "metadata.namespace": worker.ns,
                "metadata.uid": worker.uid,
                "spec.nodeName": self.node,
                "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                "status.hostIP": "127.0.0.1",
                "status.hostIPs": "127.0.0.1",
                "status.podIP": worker.pod_ip,
                "status.podIPs": worker.pod_ip,
            }
            if path not in values:
                raise EnvError(f"unsupported fieldRef {path!r}")
            return values[path]
        for key, kind in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if key in src:
                ref = src[key]
                optional = ref.get("optional", False)
                data = self.config_data(kind, worker.ns, ref["name"], optional)
                if ref["key"] not in data:
                    if optional:
                        return None
                    raise EnvError(
                        f"couldn't find key {ref['key']} in {kind[:-1]} {worker.ns}/{ref['name']}"
                    )
                return data[ref["key"]]
        if "resourceFieldRef" in src:
            ref = src["resourceFieldRef"]
            kind, _, res = ref["resource"].partition(".")
            value = ((spec.get("resources") or {}).get(kind) or {}).get(res)
            return str(value) if value is not None else "0"
        raise EnvError(f"unsupported valueFrom {sorted(src)}")

    # -- node and lease --

    def register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": "kvgate-local",
                },
            },
            "spec": {},
        }
        try:
            node = self.api.request("POST", "/api/v1/nodes", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            node = self.api.get(f"/api/v1/nodes/{self.node}")
        self.node_uid = node["metadata"]["uid"]
        self.post_node_status()
        log.info("node %s registered", self.node)

    def post_node_status(self) -> None:
        now = now_rfc3339()
        resources = {"cpu": "32", "memory": "128Gi", "pods": "250", "ephemeral-storage": "200Gi"}

        def cond(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": self._started_at,
            }

        status = {
            "conditions": [
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                cond(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                cond(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                cond(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "containerRuntimeVersion": "kvgate-local://1",
                "kernelVersion": os.uname().release,
                "osImage": "kvgate test kubelet",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        }
        self.api.patch(f"/api/v1/nodes/{self.node}/status", {"status": status})

    def heartbeat_loop(self) -> None:
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node}"
        last_status = time.monotonic()
        while not self.stopping.is_set():
            try:
                try:
                    self.api.patch(
                        lease_path,
                        {"spec": {"renewTime": now_micro(), "holderIdentity": self.node}},
                    )
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    self.api.request(
                        "POST",
                        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                        {
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {
                                "name": self.node,
                                "namespace": "kube-node-lease",
                                "ownerReferences": [
                                    {
                                        "apiVersion": "v1",
                                        "kind": "Node",
                                        "name": self.node,
                                        "uid": self.node_uid,
                                    }
                                ],
                            },
                            "spec": {
                                "holderIdentity": self.node,
                                "leaseDurationSeconds": LEASE_SECONDS,
                                "renewTime": now_micro(),
                            },
                        },
                    )
                if time.monotonic() - last_status > NODE_STATUS_SECONDS:
                    self.post_node_status()
                    last_status = time.monotonic()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            self.stopping.wait(LEASE_RENEW_SECONDS)

    # -- pods --

    def watch_loop(self) -> None:
        selector = f"spec.nodeName={self.node}"
        rv = ""
        while not self.stopping.is_set():
            try:
                if not rv:
                    rv = self.relist(selector)
                for event in self.api.watch(
                    "/api/v1/pods",
                    fieldSelector=selector,
                    resourceVersion=rv,
                    allowWatchBookmarks="true",
                    timeoutSeconds=240,
                ):
                    if self.stopping.is_set():
                        return
                    etype, obj = event["type"], event["object"]
                    if etype == "ERROR":
                        log.info("watch error (%s), relisting", obj.get("message"))
                        rv = ""
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if etype in ("ADDED", "MODIFIED"):
                        self.on_pod(obj)
                    elif etype == "DELETED":
                        self.on_gone(obj["metadata"]["uid"])
            except Exception as exc:
                if self.stopping.is_set():
                    return
                log.warning("pod watch dropped (%s: %s), relisting", type(exc).__name__, exc)
                rv = ""
                self.stopping.wait(1)

    def relist(self, selector: str) -> str:
        pods = self.api.get("/api/v1/pods", fieldSelector=selector)
        seen = set()
        for pod in pods["items"]:
            seen.add(pod["metadata"]["uid"])
            self.on_pod(pod)
        with self.lock:
            lost = [uid for uid in self.workers if uid not in seen]
        for uid in lost:
            self.on_gone(uid)
        return str(pods["metadata"]["resourceVersion"])

    def on_pod(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return  # finished before this kubelet started: nothing to run
        if self.stopping.is_set():
            return
        worker = PodWorker(self, pod)
        with self.lock:
            self.workers[uid] = worker
            self.by_name[(worker.ns, worker.pod_name)] = worker
        worker.start()

    def on_gone(self, uid: str) -> None:
        with self.lock:
            worker = self.workers.get(uid)
        if worker is not None:
            worker.mark_gone()

    def worker_done(self, worker: PodWorker) -> None:
        with self.lock:
            self.used_ips.discard(worker.pod_ip)
            self.workers.pop(worker.uid, None)
            if self.by_name.get((worker.ns, worker.pod_name)) is worker:
                del self.by_name[(worker.ns, worker.pod_name)]

    def lookup(self, ns: str, name: str) -> PodWorker | None:
        with self.lock:
            return self.by_name.get((ns, name))

    # -- lifecycle --

    def run(self) -> None:
        self._started_at = now_rfc3339()
        server = LogServer(self)
        threading.Thread(target=server.serve_forever, name="log-server", daemon=True).start()
        deadline = time.monotonic() + 120
        while True:
            try:
                self.register()
                break
            except (ApiError, httpx.HTTPError) as exc:
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
                log.warning("node registration failed (%s), retrying", exc)
                self.stopping.wait(1)
        threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True).start()
        threading.Thread(target=self.watch_loop, name="pod-watch", daemon=True).start()
        log.info("kubelet %s serving logs on https://127.0.0.1:%d", self.node, self.port)
        self.stopping.wait()
        log.info("stopping: killing pod processes")
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.wake.set()
        for w in workers:
            if w.ident is not None:
                w.join(timeout=6)
        with self.lock:
            leftovers = list(self.pgids)
        for pgid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        (self.root / "pgids").unlink(missing_ok=True)
        server.shutdown()


# --- logs over TLS -----------------------------------------------------------------


class LogServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        super().__init__(("127.0.0.1", kubelet.port), LogHandler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(kubelet.tls_cert, kubelet.tls_key)
        # The handshake then happens in the handler thread, not in the accept loop.
        self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)


class LogHandler(http.server.BaseHTTPRequestHandler):
    server: LogServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("log server: " + format, *args)

    def fail(self, code: int, message: str) -> None:
        body = message.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path in ("/healthz", "/readyz", "/livez"):
            self.fail(200, "ok")
            return
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self.fail(404, f"unsupported path {url.path}")
            return
        _, ns, pod_name, cname = parts
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        worker = self.server.kubelet.lookup(ns, pod_name)
        if worker is None:
            self.fail(404, f'pod "{pod_name}" in namespace "{ns}" is not running on this node')
            return
        c = worker.find(cname)
        if c is None:
            self.fail(404, f'container "{cname}" not found in pod "{pod_name}"')
            return
        previous = q.get("previous") == "true"
        if previous:
            instance = c.previous
            if instance is None:
                self.fail(
                    400, f'previous terminated container "{cname}" in pod "{pod_name}" not found'
                )
                return
        else:
            instance = c.current
            if instance is None:
                reason = (c.state.get("waiting") or {}).get("reason", "ContainerCreating")
                self.fail(
                    400, f'container "{cname}" in pod "{pod_name}" is waiting to start: {reason}'
                )
                return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.stream(c, instance, q)

    def stream(self, c: Container, instance: int, q: dict[str, str]) -> None:
        timestamps = q.get("timestamps") == "true"
        follow = q.get("follow") == "true"
        tail = int(q["tailLines"]) if q.get("tailLines", "").lstrip("-").isdigit() else None
        if tail is None and q.get("tail", "").isdigit():
            tail = int(q["tail"])
        limit = int(q["limitBytes"]) if q.get("limitBytes", "").isdigit() else None
        since: float | None = None
        if q.get("sinceSeconds", "").isdigit():
            since = time.time() - int(q["sinceSeconds"])
        elif q.get("sinceTime"):
            since = parse_ts(q["sinceTime"])
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        sent = 0

        def emit(raw: bytes) -> bool:
            nonlocal sent
            ts, _, text = raw.partition(b" ")
            if since is not None:
                with contextlib.suppress(ValueError):
                    if parse_ts(ts.decode()) < since:
                        return True
            out = raw if timestamps else text
            if limit is not None:
                out = out[: max(0, limit - sent)]
            self.wfile.write(out)
            sent += len(out)
            return limit is None or sent < limit

        path = c.log_path(instance)
        with open(path, "rb") if path.exists() else open(os.devnull, "rb") as f:
            lines = f.readlines()
            pending = b""
            if lines and not lines[-1].endswith(b"\n"):
                pending = lines.pop()
            if tail is not None and tail >= 0:
                lines = lines[-tail:] if tail else []
            for line in lines:
                if not emit(line):
                    return
            self.wfile.flush()
            if not follow:
                return
            while True:
                chunk = f.readline()
                if chunk:
                    pending += chunk
                    if pending.endswith(b"\n"):
                        if not emit(pending):
                            return
                        pending = b""
                        self.wfile.flush()
                    continue
                if instance not in c.open_logs:
                    # Nothing more will be written; read what is left and end.
                    rest = f.read()
                    if pending + rest:
                        emit(pending + rest)
                    return
                time.sleep(0.1)


# --- main ----------------------------------------------------------------------------


def ip_prefix_range(text: str) -> tuple[int, int]:
    """`LO-HI` (1 <= LO <= HI <= 254): the second octets pod IPs may take."""
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi) <= 254):
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO-HI within 1-254")
    return int(lo), int(hi)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="kvgate's process-running test kubelet")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", default="kvgate-node")
    parser.add_argument("--port", type=int, required=True, help="TLS port for /containerLogs")
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--root-dir", required=True, help="pod working dirs and logs")
    parser.add_argument(
        "--backoff-base", type=float, default=10.0, help="first restart back-off (s)"
    )
    parser.add_argument(
        "--backoff-cap", type=float, default=300.0, help="longest restart back-off (s)"
    )
    parser.add_argument(
        "--no-volumes",
        dest="volumes",
        action="store_false",
        help="do not bind-mount volumes (they need root and mount namespaces)",
    )
    parser.add_argument(
        "--ip-prefixes",
        type=ip_prefix_range,
        default=(16, 254),
        metavar="LO-HI",
        help="range of the pod IPs' second octet, 127.LO-HI.x.y (default 16-254)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(threadName)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    kubelet = Kubelet(args)

    def on_signal(signum: int, frame: object) -> None:
        kubelet.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    kubelet.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
