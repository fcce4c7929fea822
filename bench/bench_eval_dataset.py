"""How long `kvgate eval` takes to refuse a run whose GSM8K cannot be had, and whom it blames.

Starts one loopback endpoint that answers like an OpenAI server (and counts requests), then runs
`python -m kvgate eval` from a source tree (argv[1], default this one) RUNS times (default 5) with an empty
HF_HOME, no KVGATE_GSM8K_DIR, and either HF_HUB_OFFLINE=1 or an unreachable hub
(HF_ENDPOINT=http://127.0.0.1:9); prints wall and CPU seconds, the exit code, the requests the
endpoint saw and the error's start, then the min and median of each. Then, with `python -X
importtime`, what one offline refusal imported (the total, and numpy/scipy/httpx if loaded).
Figures only; nothing is asserted (tests/integration/test_eval_dataset.py).

    python bench/bench_eval_dataset.py [TREE] [RUNS] [offline|unreachable]
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEN: list[str] = []


class Endpoint(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        SEEN.append(self.path)
        body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    tree = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    only = sys.argv[3] if len(sys.argv) > 3 else ""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KVGATE_GSM8K"))}
    base["PYTHONPATH"] = str(tree / "operator")
    print(f"tree {tree}, load average {os.getloadavg()[0]:.1f}")
    for label, extra in (
        ("HF_HUB_OFFLINE=1", {"HF_HUB_OFFLINE": "1"}),
        ("hub unreachable", {"HF_ENDPOINT": "http://127.0.0.1:9"}),
    ):
        if only and only not in label.lower():
            continue
        walls, cpus = [], []
        for i in range(runs):
            env = {**base, **extra, "HF_HOME": tempfile.mkdtemp(prefix="bench-hf-")}
            SEEN.clear()
            argv = [sys.executable, "-m", "kvgate", "eval", "--limit", "20"]
            argv += ["--control-url", url, "--candidate-url", url]
            started, cpu0 = time.monotonic(), cpu()
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
            wall, used = time.monotonic() - started, cpu() - cpu0
            walls.append(wall)
            cpus.append(used)
            lines = done.stdout.splitlines()
            error = json.loads(lines[-1]).get("error") if lines else done.stderr[-200:]
            print(
                f"{label} run {i + 1}: exit {done.returncode}, {wall:.2f} s wall, {used:.2f} s "
                f"CPU, endpoint requests {len(SEEN)}: {str(error)[:110]}"
            )
        print(
            f"{label}: wall min {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
            f"CPU min {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s "
            f"(load average {os.getloadavg()[0]:.1f})"
        )
    env = {**base, "HF_HUB_OFFLINE": "1", "HF_HOME": tempfile.mkdtemp(prefix="bench-hf-")}
    argv = [sys.executable, "-X", "importtime", "-m", "kvgate", "eval", "--limit", "20"]
    argv += ["--control-url", url, "--candidate-url", url]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    rows = re.findall(r"^import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)$", done.stderr, re.M)
    total = sum(int(us) for us, indent, _ in rows if len(indent) <= 1) / 1e6
    heavy = {
        n: int(us) / 1e6 for us, _, n in rows if n in ("numpy", "scipy", "scipy.stats", "httpx")
    }
    print(f"-X importtime, one offline refusal: {total:.2f} s of imports; heavy: {heavy or 'none'}")


if __name__ == "__main__":
    main()
