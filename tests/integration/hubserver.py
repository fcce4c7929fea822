"""A loopback stand-in for the Hugging Face hub, enough for huggingface_hub's read paths.

Routes (as the real hub answers them):
    GET  /api/models/{org}/{name}[/revision/{rev}]      model info with `sha` and `siblings`
    HEAD /{org}/{name}/resolve/{rev}/{path}             ETag, X-Repo-Commit, Content-Length
    GET  /{org}/{name}/resolve/{rev}/{path}             body, honouring `Range: bytes=a-b`
Errors carry the hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo) so the client raises the same exceptions it raises against the real hub.
Every body byte sent is counted per file, so tests can prove no shard was downloaded.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class FakeRepo:
    files: dict[str, Path]
    sha: str
    branches: tuple[str, ...] = ("main",)
    token: str | None = None  # private: requests need `Authorization: Bearer <token>`
    gated: bool = False
    honour_range: bool = True  # False: answer Range requests with the whole file (a bad mirror)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int
    authorized: bool


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    _served: Counter[str] = field(default_factory=Counter)  # body bytes sent, per file path
    _requests: list[Request] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Handlers between a request's arrival and its record: a client can have the whole response
    # (and a test read the counts) before the handler thread records what it sent.
    _busy: int = 0
    _settled: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._settled = threading.Condition(self._lock)

    def _settle(self) -> None:
        """Wait (the lock held) until every request that arrived has been recorded."""
        if not self._settled.wait_for(lambda: self._busy == 0, timeout=30):
            raise TimeoutError("the fake hub's handlers did not finish in 30 s")

    @property
    def served(self) -> Counter[str]:
        """Body bytes sent per file path, once every request so far is recorded."""
        with self._lock:
            self._settle()
            return Counter(self._served)

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            self._settle()
            return list(self._requests)

    def add_repo(
        self,
        repo_id: str,
        directory: Path,
        *,
        token: str | None = None,
        gated: bool = False,
        honour_range: bool = True,
        branches: tuple[str, ...] = ("main",),
    ) -> FakeRepo:
        files = {
            p.relative_to(directory).as_posix(): p
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        }
        sha = hashlib.sha1(repo_id.encode() + b"".join(n.encode() for n in files)).hexdigest()
        repo = FakeRepo(files, sha, branches, token, gated, honour_range)
        self.repos[repo_id] = repo
        return repo

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the hub first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def bytes_served(self, suffix: str = "") -> int:
        with self._lock:
            self._settle()
            return sum(n for path, n in self._served.items() if path.endswith(suffix))

    def reset_counts(self) -> None:
        with self._lock:
            self._settle()
            self._served.clear()
            self._requests.clear()

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        class Server(ThreadingHTTPServer):
            # the default backlog of 5 drops parallel connects: the client's SYN retry costs 1 s
            request_queue_size = 128

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"
    # headers and body go out in two writes; without this, Nagle + delayed ACK add 40 ms each
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self._recorded(body=True)

    def do_HEAD(self) -> None:
        self._recorded(body=False)

    def _recorded(self, body: bool) -> None:
        with self.fake._lock:
            self.fake._busy += 1
        try:
            self._route(body)
        finally:
            with self.fake._lock:
                self.fake._busy -= 1
                self.fake._settled.notify_all()

    def _route(self, body: bool) -> None:
        path = urlsplit(self.path).path
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            self._model_info("/".join(parts[2:4]), parts[5] if len(parts) >= 6 else "main", body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        else:
            self._error(404, None, body)

    def _access(self, repo_id: str, revision: str, body: bool) -> FakeRepo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None or (
            repo.token and self.headers.get("authorization") != f"Bearer {repo.token}"
        ):
            self._error(401, "RepoNotFound", body)
            return None
        if repo.gated:
            self._error(403, "GatedRepo", body)
            return None
        if revision not in repo.branches and revision != repo.sha:
            self._error(404, "RevisionNotFound", body)
            return None
        return repo

    def _model_info(self, repo_id: str, revision: str, body: bool) -> None:
        repo = self._access(repo_id, revision, body)
        if repo is None:
            return
        info = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": repo.sha,
            "private": repo.token is not None,
            "siblings": [{"rfilename": name} for name in repo.files],
        }
        self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body, None)

    def _resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        repo = self._access(repo_id, revision, body)
        if repo is None:
            return
        path = repo.files.get(filename)
        if path is None:
            self._error(404, "EntryNotFound", body)
            return
        size = path.stat().st_size
        headers = {
            "ETag": f'"{hashlib.sha1(f"{repo.sha}/{filename}".encode()).hexdigest()}"',
            "X-Repo-Commit": repo.sha,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start, end, status = 0, size - 1, 200
        wanted = self.headers.get("range")
        if wanted and repo.honour_range:
            match = _RANGE.match(wanted.strip())
            if match is None or int(match.group(1)) >= size:
                headers["Content-Range"] = f"bytes */{size}"
                self._send(416, b"", headers, body, filename)
                return
            start = int(match.group(1))
            end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        with path.open("rb") as f:
            f.seek(start)
            data = f.read(end - start + 1) if body else b""
        headers["Content-Length"] = str(end - start + 1)
        self._send(status, data, headers, body, filename, length_set=True)

    def _error(self, status: int, code: str | None, body: bool) -> None:
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": code or "not found"}).encode(), headers, body, None)

    def _send(
        self,
        status: int,
        data: bytes,
        headers: dict[str, str],
        body: bool,
        filename: str | None,
        length_set: bool = False,
    ) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if not length_set:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        sent = 0
        if body and data:
            try:
                self.wfile.write(data)
                sent = len(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading early; count what it could not refuse
        with self.fake._lock:
            if filename is not None:
                self.fake._served[filename] += sent
            self.fake._requests.append(
                Request(
                    self.command,
                    self.path,
                    self.headers.get("range"),
                    status,
                    self.headers.get("authorization") is not None,
                )
            )


# Per-layer tensors of a Qwen3/Llama-style decoder, as named in published checkpoints.
LAYER_TENSORS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


def write_checkpoint(
    directory: Path,
    *,
    layers: int = 36,
    shards: int = 1,
    config: dict[str, Any] | None = None,
    scales: tuple[str, ...] = ("self_attn.k_scale", "self_attn.v_scale"),
    weight_shape: tuple[int, ...] = (64, 64),
    single_file: bool = False,
) -> list[Path]:
    """A safetensors checkpoint with realistic tensor names and tiny (zero) weights.

    Layers are split into `shards` contiguous runs; `single_file` writes `model.safetensors`
    without an index. Returns the safetensors files written.
    """
    import numpy as np
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(config or {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": layers})
    )
    names = ["model.embed_tokens.weight"]
    for layer in range(layers):
        names += [f"model.layers.{layer}.{t}" for t in (*LAYER_TENSORS, *scales)]
    names += ["model.norm.weight", "lm_head.weight"]
    per_shard = -(-len(names) // shards)
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for shard in range(shards):
        chunk = names[shard * per_shard : (shard + 1) * per_shard]
        filename = (
            "model.safetensors"
            if single_file
            else f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        )
        tensors = {
            name: np.ones((), dtype=np.float32)
            if name.endswith("_scale")
            else np.zeros(weight_shape, dtype=np.float16)
            for name in chunk
        }
        save_file(tensors, str(directory / filename), metadata={"format": "pt"})
        written.append(directory / filename)
        weight_map.update(dict.fromkeys(chunk, filename))
    if not single_file:
        index = {
            "metadata": {"total_size": sum(p.stat().st_size for p in written)},
            "weight_map": weight_map,
        }
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return written


def header_bytes(path: Path) -> int:
    """8-byte length prefix + JSON header of one safetensors file, read independently."""
    with path.open("rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")
