"""Read a checkpoint's config.json and safetensors headers, from a directory or the hub.

Only the headers are read, never the weights: locally with two `pread` calls per file
(the 8-byte length, then the JSON), on the hub with two HTTP Range requests per shard
through huggingface_hub's own session, URL builder, auth headers and error mapping.
`HfApi.get_safetensors_metadata` would also work, but it asks for the first 100 kB of every
shard to save a round trip, which for small headers is many times the header size; it is
kept as `reader="hfapi"` for comparison (bench/bench_checkpoint_scan.py).
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpcore2
import httpx2
from huggingface_hub import HfApi, constants, get_token, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    NotASafetensorsRepoError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)
from huggingface_hub.utils import (
    build_hf_headers,
    get_session,
    hf_raise_for_status,
    set_client_factory,
)
from huggingface_hub.utils._http import default_client_factory

from kvgate.adapters import http
from kvgate.checkpoint import scales as checkpoint
from kvgate.checkpoint.capacity import KVLayout, parse_kv_layout
from kvgate.checkpoint.scales import ScaleReport, TensorInfo, parse_safetensors_header, scan_scales
from kvgate.errors import HubError, ParseError, SpecError
from kvgate.inputs import load_json, read_text
from kvgate.redact import hide

CONFIG_FILE: Final = "config.json"
MODELOPT_FILE: Final = "hf_quant_config.json"  # ModelOpt's quantization summary
SINGLE_FILE: Final = constants.SAFETENSORS_SINGLE_FILE
INDEX_FILE: Final = constants.SAFETENSORS_INDEX_FILE
MAX_HEADER_BYTES: Final = constants.SAFETENSORS_MAX_HEADER_LENGTH
HEADER_WORKERS: Final = 8
MAX_SHARDS: Final = 4096
_NOT_SAFETENSORS: Final = f"no {SINGLE_FILE} or {INDEX_FILE}; kvgate reads safetensors checkpoints"
_REPO_ID: Final = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+\Z")
# The whole hub read (model info, config, every header) ends by then, however the hub answers:
# huggingface_hub's client has no timeout, and a per-read timeout never trips on a trickle.
DEFAULT_HUB_DEADLINE_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class CheckpointHeaders:
    """What was read of one checkpoint: its config, tensor headers and the cost of reading."""

    source: str
    config: Mapping[str, Any] | None
    tensors: Mapping[str, TensorInfo]
    files: tuple[str, ...]
    header_bytes: int  # 8-byte length + JSON header, summed over the safetensors files
    bytes_read: int | None  # safetensors bytes read or received; None when not counted
    commit: str | None = None
    modelopt_config: Mapping[str, Any] | None = None  # hf_quant_config.json, when present
    # What the k/v scale tensors hold, by name (local checkpoints: `read_scale_values`)
    scale_values: Mapping[str, tuple[float, ...]] | None = None

    def analyse(self) -> tuple[KVLayout, ScaleReport]:
        """The KV layout from config.json and the KV-scale report from the tensor headers."""
        if self.config is None:
            raise ParseError(f"{self.source}/{CONFIG_FILE}", "no such file")
        layout = parse_kv_layout(self.config, source=f"{self.source}/{CONFIG_FILE}")
        scales = scan_scales(
            self.tensors,
            config=self.config,
            kv_layers=layout.kv_layer_indices,
            modelopt_config=self.modelopt_config,
            source=self.source,
            values=self.scale_values,
        )
        return layout, scales

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "files": list(self.files),
            "tensor_count": len(self.tensors),
            "header_bytes": self.header_bytes,
            "bytes_read": self.bytes_read,
            "commit": self.commit,
        }


def looks_like_repo_id(text: str) -> bool:
    """`org/name` as the hub spells repo ids (a local path that exists wins over this)."""
    return bool(_REPO_ID.match(text)) and ".." not in text


def read_json_file(path: str | Path) -> dict[str, Any]:
    """A JSON object from a file; missing or malformed files raise ParseError naming it."""
    return _json_object(read_text(path), str(path))


def read_local_checkpoint(path: str | Path) -> CheckpointHeaders:
    """Headers of a local model directory (or one .safetensors file) and its config.json."""
    path = Path(path)
    if path.is_file():
        directory, files = path.parent, [path.name]
    elif path.is_dir():
        directory, files = path, _local_weight_files(path)
    elif path.exists():  # a device, pipe or socket: nothing here to read headers from
        raise ParseError(str(path), "is not a regular file or a directory")
    else:
        raise ParseError(str(path), "no such file or directory")
    config_path, modelopt_path = directory / CONFIG_FILE, directory / MODELOPT_FILE
    config = read_json_file(config_path) if config_path.exists() else None
    modelopt = read_json_file(modelopt_path) if modelopt_path.exists() else None

    tensors, values, header_bytes, read = _read_local_files(
        [(str(directory / name), directory / name) for name in files]
    )
    return CheckpointHeaders(
        str(path), config, tensors, tuple(files), header_bytes, read, None, modelopt, values
    )


def _read_local_files(
    files: Iterable[tuple[str, Path]],
) -> tuple[dict[str, TensorInfo], dict[str, tuple[float, ...]], int, int]:
    """(tensors, scale values, header bytes, bytes read) of local safetensors files, each given
    as (how messages name it, path)."""
    tensors: dict[str, TensorInfo] = {}
    values: dict[str, tuple[float, ...]] = {}
    header_bytes = scale_bytes = 0
    for shown, path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            header = _read_local_header(fd, str(path))
            found = parse_safetensors_header(header, shown)
            read, count = read_scale_values(fd, str(path), 8 + len(header), found.values())
        finally:
            os.close(fd)
        tensors.update(found)
        values.update(read)
        header_bytes += 8 + len(header)
        scale_bytes += count
    # pread asks for exactly the header and each scale, so that is what was read
    return tensors, values, header_bytes, header_bytes + scale_bytes


def read_scale_values(
    fd: int, where: str, data_start: int, infos: Iterable[TensorInfo]
) -> tuple[dict[str, tuple[float, ...]], int]:
    """The values of the k/v scale tensors among `infos` of one open safetensors file, read one
    by one with pread at `data_start` (8 + header length) + their offsets; nothing else is read.
    Returns ({name: values}, bytes read)."""
    out: dict[str, tuple[float, ...]] = {}
    total = 0
    for info in infos:
        if not readable_scale(info):
            continue
        begin, end = info.data_offsets or (0, 0)
        data = os.pread(fd, end - begin, data_start + begin)
        total += len(data)
        if len(data) != end - begin:
            raise ParseError(where, f"tensor '{info.name[:80]}' ends past the file's end")
        out[info.name] = decode_scale(info, data)
    return out, total


# Scale tensors worth reading: per-tensor scalars or per-head vectors. A "scale" this large is
# not a KV scale; it is left unread (and unjudged) rather than read.
MAX_SCALE_ELEMENTS: Final = 4096
SCALE_DTYPES: Final[Mapping[str, tuple[str, int]]] = {
    "F32": ("<f", 4),
    "F64": ("<d", 8),
    "F16": ("<e", 2),
    "BF16": ("bf16", 2),
}


def decode_scale(info: TensorInfo, data: bytes) -> tuple[float, ...]:
    """The values of a small float tensor's bytes (little-endian, as safetensors stores them)."""
    fmt, size = SCALE_DTYPES[str(info.dtype)]
    count = len(data) // size
    if fmt == "bf16":  # the high half of a float32
        return tuple(
            struct.unpack("<f", b"\x00\x00" + data[i * 2 : i * 2 + 2])[0] for i in range(count)
        )
    return struct.unpack(f"<{count}{fmt[1]}", data[: count * size])


def readable_scale(info: TensorInfo) -> bool:
    """A KV scale small enough, and of a float dtype, to read (see MAX_SCALE_ELEMENTS)."""
    elements = info.elements
    return (
        checkpoint.is_kv_scale(info.name)
        and info.dtype in SCALE_DTYPES
        and info.data_offsets is not None
        and elements is not None
        and elements <= MAX_SCALE_ELEMENTS
        and info.data_offsets[1] - info.data_offsets[0]
        == elements * SCALE_DTYPES[str(info.dtype)][1]
    )


# --- an overall deadline on the hub client's sockets (adapters.http's) -------------------------


def _client_with_deadlines() -> httpx2.Client:
    """huggingface_hub's own client, its connection pools on deadline-bound sockets."""
    client = default_client_factory()
    http.bounded_sockets(client, httpcore2)
    return client


_installed = threading.Lock()
_factory_set = False
_DEADLINE_TOLERANCE_S: Final = 0.25


def read_hub_checkpoint(
    repo_id: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    endpoint: str | None = None,
    reader: str = "ranges",
    deadline_s: float = DEFAULT_HUB_DEADLINE_S,
) -> CheckpointHeaders:
    """Headers of a hub repo at `revision` (default main), reading only header bytes.

    `endpoint` defaults to HF_ENDPOINT; `token` to huggingface_hub's usual lookup (HF_TOKEN,
    the saved login); False sends none. The whole read ends within `deadline_s` (HubError),
    however slowly the hub answers. No message holds the token, whatever it contains.
    """
    if reader not in ("ranges", "hfapi"):
        raise SpecError("reader", f"'{reader}' is not a header reader; use ranges or hfapi")
    sent = token if isinstance(token, str) else (None if token is False else get_token())
    where = f"{repo_id}@{revision or constants.DEFAULT_REVISION}"
    global _factory_set
    with _installed:
        if not _factory_set:
            set_client_factory(_client_with_deadlines)
            _factory_set = True
    deadline = time.monotonic() + deadline_s
    try:
        # every hub socket operation of this call, and of the tasks it copies its context into
        with http.deadline(deadline):
            return _read_hub_checkpoint(repo_id, revision, token, endpoint, reader, where)
    except httpx2.TimeoutException as exc:
        # a socket timeout is cut to what is left, so it ends at the deadline, give or take
        if time.monotonic() >= deadline - _DEADLINE_TOLERANCE_S:
            raise HubError(
                f"{where}: no complete answer from the hub within {deadline_s:g} s "
                "(too slow, or trickling)"
            ) from None
        raise HubError(f"{where}: the hub did not answer ({type(exc).__name__})") from None
    except httpx2.LocalProtocolError:
        # h11 refuses a header it cannot send, and quotes it: the token's, typically.
        raise HubError(
            f"{where}: the request could not be sent: a header value is not valid HTTP "
            "(a token with a line break or a control character?); it is not shown"
        ) from None
    except (HubError, SpecError, ParseError) as exc:
        cleaned = hide(str(exc), sent)
        if cleaned == str(exc):
            raise
        raise HubError(cleaned, unreachable=getattr(exc, "unreachable", False)) from None


def _read_hub_checkpoint(
    repo_id: str,
    revision: str | None,
    token: str | bool | None,
    endpoint: str | None,
    reader: str,
    where: str,
) -> CheckpointHeaders:
    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = api.model_info(repo_id, revision=revision, token=token)
        commit = info.sha or revision or constants.DEFAULT_REVISION
        siblings = {s.rfilename for s in info.siblings or []}
        fetch = _HubFiles(api.endpoint, repo_id, commit, token)
        config, modelopt = (
            _json_object(fetch.text(name), f"{where}/{name}") if name in siblings else None
            for name in (CONFIG_FILE, MODELOPT_FILE)
        )
        if reader == "hfapi":
            return _read_with_hfapi(api, repo_id, commit, token, where, config)
        files = _hub_weight_files(siblings, fetch, where)
        with ThreadPoolExecutor(max_workers=HEADER_WORKERS) as pool:
            # each task in a copy of this context: the deadline goes with it
            tasks = [
                pool.submit(contextvars.copy_context().run, fetch.safetensors_header, name)
                for name in files
            ]
            headers = [task.result() for task in tasks]
    except GatedRepoError as exc:
        raise HubError(
            f"{where}: the repo is gated; accept its terms on the hub and pass a token (--token-env)"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise SpecError(
            "model", f"hub repo '{repo_id}' not found (a private repo needs a token: --token-env)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise SpecError(
            "revision", f"'{revision}' is not a revision of hub repo '{repo_id}'"
        ) from exc
    except EntryNotFoundError as exc:
        raise ParseError(
            where, f"a file the repo lists is missing on the hub ({_first_line(exc)})"
        ) from exc
    except OfflineModeIsEnabled as exc:
        raise HubError(
            f"{where}: HF_HUB_OFFLINE is set; unset it to read the hub", unreachable=True
        ) from exc
    except HfHubHTTPError as exc:
        raise HubError(f"{where}: the hub answered: {_first_line(exc)}") from exc
    except (httpx2.TimeoutException, httpx2.LocalProtocolError):
        raise  # read_hub_checkpoint says these in its own words, without the request
    except httpx2.HTTPError as exc:
        raise HubError(
            f"{where}: cannot reach the hub ({type(exc).__name__}: {_first_line(exc)})",
            unreachable=True,
        ) from exc

    tensors: dict[str, TensorInfo] = {}
    for name, (header, _) in zip(files, headers, strict=True):
        tensors.update(parse_safetensors_header(header, f"{where}/{name}"))
    return CheckpointHeaders(
        source=where,
        config=config,
        tensors=tensors,
        files=tuple(files),
        header_bytes=sum(8 + len(header) for header, _ in headers),
        bytes_read=sum(received for _, received in headers),
        commit=commit,
        modelopt_config=modelopt,
    )


def read_cached_checkpoint(
    repo_id: str, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> CheckpointHeaders | Path | None:
    """What the local Hugging Face cache holds of `repo_id` at `revision` (default main).

    Found through huggingface_hub's cache API (`try_to_load_from_cache`: refs, snapshots),
    no network. Returns the headers when config.json and every safetensors file are cached;
    the cached config.json's path when only it is (capacity, scales unknown); None when even
    config.json is not cached.
    """
    rev = revision or constants.DEFAULT_REVISION

    def cached(filename: str) -> Path | None:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=rev)
        return Path(found) if isinstance(found, str) else None

    config_path = cached(CONFIG_FILE)
    if config_path is None:
        return None
    snapshot = config_path.parent
    where = f"{repo_id}@{rev} (cached {snapshot})"
    index_path = cached(INDEX_FILE)
    if index_path is not None:
        files = _index_files(read_json_file(index_path), str(index_path))
    else:
        files = [SINGLE_FILE] if cached(SINGLE_FILE) is not None else []
    for name in files:
        # an index entry such as ../../x must not read outside the snapshot
        if not Path(os.path.normpath(snapshot / name)).is_relative_to(snapshot):
            raise ParseError(
                str(index_path), f"weight_map names {name[:80]!r}, outside the snapshot"
            )
    weights = [cached(name) for name in files]
    if not files or any(path is None for path in weights):
        return config_path
    modelopt_path = cached(MODELOPT_FILE)
    tensors, values, header_bytes, read = _read_local_files(
        (f"{where}/{name}", path) for name, path in zip(files, weights, strict=True) if path
    )
    config = read_json_file(config_path)
    modelopt = None if modelopt_path is None else read_json_file(modelopt_path)
    return CheckpointHeaders(
        where, config, tensors, tuple(files), header_bytes, read, snapshot.name, modelopt, values
    )


class _HubFiles:
    """Small GETs against one repo at one commit, with the hub client's session and auth."""

    def __init__(self, endpoint: str, repo_id: str, commit: str, token: str | bool | None) -> None:
        self.endpoint = endpoint
        self.repo_id = repo_id
        self.commit = commit
        self.headers = build_hf_headers(token=token)

    def url(self, filename: str) -> str:
        return hf_hub_url(self.repo_id, filename, revision=self.commit, endpoint=self.endpoint)

    def text(self, filename: str) -> str:
        response = get_session().get(self.url(filename), headers=self.headers)
        hf_raise_for_status(response)
        return response.text

    def safetensors_header(self, filename: str) -> tuple[bytes, int]:
        """(JSON header, bytes received): the 8-byte length, then exactly the header."""
        prefix, received = self._range(filename, 0, 8)
        length = _header_length(prefix, f"{self.repo_id}@{self.commit}/{filename}")
        header, more = self._range(filename, 8, length)
        return header, received + more

    def _range(self, filename: str, start: int, length: int) -> tuple[bytes, int]:
        headers = {**self.headers, "Range": f"bytes={start}-{start + length - 1}"}
        # Streamed, so a server that ignores Range cannot push the whole shard at us.
        with get_session().stream("GET", self.url(filename), headers=headers) as response:
            hf_raise_for_status(response)
            skip = start if response.status_code == 200 else 0
            data = bytearray()
            for chunk in response.iter_bytes():
                data.extend(chunk)
                if len(data) >= skip + length:
                    break
        if len(data) < skip + length:
            raise ParseError(
                f"{self.repo_id}@{self.commit}/{filename}",
                f"file ends after {len(data)} bytes; not a safetensors file",
            )
        return bytes(data[skip : skip + length]), len(data)


def _read_with_hfapi(
    api: HfApi,
    repo_id: str,
    commit: str,
    token: str | bool | None,
    where: str,
    config: Mapping[str, Any] | None,
) -> CheckpointHeaders:
    try:
        metadata = api.get_safetensors_metadata(repo_id, revision=commit, token=token)
    except NotASafetensorsRepoError as exc:
        raise ParseError(where, _NOT_SAFETENSORS) from exc
    except SafetensorsParsingError as exc:
        raise ParseError(where, _first_line(exc)) from exc
    tensors = {
        name: TensorInfo(name, info.dtype, tuple(info.shape), _offsets(info.data_offsets))
        for file_metadata in metadata.files_metadata.values()
        for name, info in file_metadata.tensors.items()
    }
    files = tuple(sorted(metadata.files_metadata))
    header_bytes = sum(
        8 + len(json.dumps(_header_dict(m), separators=(",", ":")).encode())
        for m in metadata.files_metadata.values()
    )
    # the library does not report what it received; the caller counts on its side
    return CheckpointHeaders(where, config, tensors, files, header_bytes, None, commit)


def _offsets(value: Any) -> tuple[int, int] | None:
    """huggingface_hub's (begin, end), as the header reader keeps them."""
    if isinstance(value, list | tuple) and len(value) == 2 and all(type(v) is int for v in value):
        return (value[0], value[1])
    return None


def _header_dict(file_metadata: Any) -> dict[str, Any]:
    # An approximation of the header size, for the report; the exact bytes are not kept.
    return {
        name: {"dtype": info.dtype, "shape": info.shape, "data_offsets": info.data_offsets}
        for name, info in file_metadata.tensors.items()
    }


def _hub_weight_files(siblings: set[str], fetch: _HubFiles, where: str) -> list[str]:
    if INDEX_FILE in siblings:
        index = _json_object(fetch.text(INDEX_FILE), f"{where}/{INDEX_FILE}")
        return _index_files(index, f"{where}/{INDEX_FILE}")
    if SINGLE_FILE in siblings:
        return [SINGLE_FILE]
    top_level = sorted(s for s in siblings if s.endswith(".safetensors") and "/" not in s)
    if top_level:
        return top_level
    raise ParseError(where, _NOT_SAFETENSORS)


def _local_weight_files(directory: Path) -> list[str]:
    index_path = directory / INDEX_FILE
    if index_path.exists():
        files = _index_files(read_json_file(index_path), str(index_path))
        root = directory.resolve()
        for name in files:
            # An entry such as ../../etc/passwd (or a symlink out) would read outside the model.
            if not (directory / name).resolve().is_relative_to(root):
                raise ParseError(
                    str(index_path),
                    f"weight_map names {name[:80]!r}, which is outside the model directory",
                )
            if not (directory / name).is_file():
                raise ParseError(
                    str(index_path), f"weight_map names '{name}' but the file is missing"
                )
        return files
    if (directory / SINGLE_FILE).is_file():
        return [SINGLE_FILE]
    files = sorted(p.name for p in directory.glob("*.safetensors") if p.is_file())
    if not files:
        raise ParseError(str(directory), _NOT_SAFETENSORS)
    return files


def _index_files(index: Mapping[str, Any], source: str) -> list[str]:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, Mapping) or not weight_map:
        raise ParseError(source, "field 'weight_map' is missing or empty")
    values = list(weight_map.values())
    if not all(isinstance(name, str) and name and "\x00" not in name for name in values):
        raise ParseError(source, "field 'weight_map' must map tensor names to file names")
    names = set(values)
    if len(names) > MAX_SHARDS:
        raise ParseError(source, f"field 'weight_map' names more than {MAX_SHARDS} files")
    return sorted(names)


def _read_local_header(fd: int, where: str) -> bytes:
    """The JSON header, with unbuffered reads: exactly 8 + header length bytes."""
    prefix = os.pread(fd, 8, 0)
    if len(prefix) < 8:
        raise ParseError(where, f"file has {len(prefix)} bytes; not a safetensors file")
    length = _header_length(prefix, where, os.fstat(fd).st_size)
    header = os.pread(fd, length, 8)
    if len(header) < length:
        raise ParseError(
            where, f"header needs {length} bytes but the file ends after {len(header)}"
        )
    return header


def _header_length(prefix: bytes, where: str, size: int | None = None) -> int:
    """The JSON header's length from the 8-byte prefix, refused past the cap or the file's end."""
    length: int = struct.unpack("<Q", prefix)[0]
    # The length is not echoed: for a file that is not safetensors it is 8 of its bytes.
    if length > MAX_HEADER_BYTES or (size is not None and length > size - 8):
        limit = (
            f"the file ({size:,} bytes)"
            if length <= MAX_HEADER_BYTES
            else f"the cap of {MAX_HEADER_BYTES:,} bytes"
        )
        raise ParseError(where, f"not a safetensors file: its header length is larger than {limit}")
    return length


def _json_object(text: str, source: str) -> dict[str, Any]:
    value = load_json(text, source)
    if not isinstance(value, dict):
        raise ParseError(source, f"expected a JSON object, got {type(value).__name__}")
    return value


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(exc).__name__
