"""A real Prometheus server for tests: `prometheus` (Debian's package) on 127.0.0.1.

    with Prometheus(tmp_path, targets=["127.0.0.1:8001"], scrape_interval="1s") as prom:
        prom.wait_up(2)                           # every target scraped and up
        httpx.get(prom.url + "/api/v1/query", params={"query": "up"})

The server gets a temp data dir, a free loopback port, and a scrape config of static targets
read through file_sd (`set_targets()` / `set_target_groups()` rewrite the file; Prometheus
re-reads it within a second), plus any `extra_scrape_configs`. Debian's build has no
kubernetes_sd_configs (the Kubernetes discovery is left out of the package): tests that
follow pods write their IPs with `set_target_groups()`. It is stopped (SIGTERM, then SIGKILL)
on exit; its log is `log_path`.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str] = (),
        *,
        scrape_interval: str = "1s",
        metrics_path: str = "/metrics",
        extra_scrape_configs: Sequence[dict[str, Any]] = (),
        job: str = "engines",
    ) -> None:
        found = binary()
        if found is None:
            raise FileNotFoundError("prometheus is not installed (apt-get install prometheus)")
        self.binary = found
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.dir / "prometheus.log"
        self.targets_path = self.dir / "targets.json"
        self.job = job
        self.set_targets(targets)
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [
                {
                    "job_name": job,
                    "metrics_path": metrics_path,
                    "scrape_timeout": scrape_interval,
                    "file_sd_configs": [
                        {"files": [str(self.targets_path)], "refresh_interval": "1s"}
                    ],
                },
                *extra_scrape_configs,
            ],
        }
        self.config_path = self.dir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def set_targets(self, targets: Sequence[str]) -> None:
        """Replace the file_sd targets (written atomically, as file_sd wants)."""
        self.set_target_groups([{"targets": list(targets), "labels": {}}] if targets else [])

    def set_target_groups(self, groups: Sequence[dict[str, Any]]) -> None:
        """Replace the file_sd target groups: `[{"targets": [...], "labels": {...}}, ...]`."""
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(groups)))
        tmp.replace(self.targets_path)

    def start(self, timeout: float = 30.0) -> Prometheus:
        with self.log_path.open("wb") as sink:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited {self.proc.returncode}:\n{self.log()[-2000:]}"
                )
            try:
                if httpx.get(self.url + "/-/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {timeout:g} s:\n{self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def active_targets(self) -> list[dict[str, Any]]:
        body = httpx.get(self.url + "/api/v1/targets", params={"state": "active"}, timeout=5.0)
        body.raise_for_status()
        found: list[dict[str, Any]] = body.json()["data"]["activeTargets"]
        return found

    def wait_up(self, count: int, timeout: float = 30.0, job: str | None = None) -> None:
        """Until `count` targets (of `job`, default this one's) have been scraped and are up."""
        job = job or self.job
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            seen = [t for t in self.active_targets() if t["labels"].get("job") == job]
            if len([t for t in seen if t["health"] == "up"]) >= count:
                return
            time.sleep(0.2)
        shown = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in seen]
        raise RuntimeError(f"{count} targets of job {job} not up after {timeout:g} s: {shown}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
