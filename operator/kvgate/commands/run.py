"""`kvgate run`: run the KVCacheRollout operator (kopf) in the foreground."""

from __future__ import annotations

import argparse
import ctypes
import os
from typing import Any, Final

from kvgate.config import DEFAULT_METRICS_PORT, DEFAULT_POLL_INTERVAL_S, OperatorConfig

EXAMPLES: Final = ("kvgate run -n llm --liveness http://0.0.0.0:8080/healthz",)

_LOG_FORMATS = ("plain", "full", "json")
_M_ARENA_MAX: Final = -8  # glibc's mallopt parameter (malloc.h)
MALLOC_ARENAS: Final = 2
WRITE_CONNECTIONS: Final = 8


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; globs allowed; "
        "default: $KVGATE_NAMESPACE, else 'default')",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the operator's Prometheus /metrics on this port, 0 for off "
        f"(default: $KVGATE_METRICS_PORT, else {DEFAULT_METRICS_PORT})",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="seconds between checks of a waiting rollout "
        f"(default: $KVGATE_POLL_INTERVAL, else {DEFAULT_POLL_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act only while holding a Lease, so two operators never act at once",
    )
    parser.add_argument(
        "--lease-namespace",
        default=None,
        help="namespace of the Lease (default: $KVGATE_NAMESPACE, else the first watched one)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-format", choices=_LOG_FORMATS, default="full", help="log lines")
    parser.add_argument("--json", action="store_true", help="same as --log-format=json")


def cap_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas before any thread starts; True when capped.

    glibc gives threads that allocate at once arenas of their own (up to 8 per core), and what
    the handler threads free stays in them: with two, 100 rollouts at once peak at ~206 MiB
    instead of ~257 (bench/RESULTS-operator.md). MALLOC_ARENA_MAX in the environment wins; a
    libc without mallopt (musl) is left as it is."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, MALLOC_ARENAS))


def api_connections(namespaces: list[str], *, clusterwide: bool) -> int:
    """kopf's connection bound: one long-lived watch stream per watched namespace (one for the
    whole cluster) plus WRITE_CONNECTIONS for status writes and Events; 0 (no bound) when a
    glob may match any number of namespaces, each with its own stream."""
    if clusterwide:
        return WRITE_CONNECTIONS + 1
    if any(c in ns for ns in namespaces for c in "*?[!,"):
        return 0
    return WRITE_CONNECTIONS + len(namespaces) + 1  # + the namespaces watch kopf may open


def run(args: argparse.Namespace) -> int:
    cap_malloc_arenas()  # first: kopf's and the handlers' threads start below
    import kopf

    import kvgate.controller.handlers  # noqa: F401  (registers the handlers)

    # Flags override the environment, which overrides the defaults; built once, here.
    config = OperatorConfig.from_env(os.environ).with_overrides(
        metrics_port=args.metrics_port, poll_interval_s=args.poll_interval
    )
    log_format = "json" if args.json else args.log_format
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[log_format.upper()])
    namespaces = list(args.namespace)
    if not namespaces and not args.all_namespaces:
        namespaces = [os.environ.get("KVGATE_NAMESPACE") or "default"]
    if args.leader_elect:
        _lead(args, namespaces)
    kopf.run(
        standalone=True,  # the Lease elects the one operator that acts; kopf peering would freeze
        # operators of equal priority instead
        clusterwide=bool(args.all_namespaces),
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(
            config=config,
            api_connections=api_connections(namespaces, clusterwide=bool(args.all_namespaces)),
        ),
    )
    if args.leader_elect:
        _exit_now(0)
    return 0


def _exit_now(code: int) -> None:
    """Leave without interpreter finalization. The Lease thread (a daemon) may be inside a log
    write or an API call when kopf returns; finalizing then can abort the process (SIGABRT,
    exit -6) after a clean stop, which a supervisor reads as a crash.
    """
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _lead(args: argparse.Namespace, namespaces: list[str]) -> None:
    """Wait for the Lease, answering liveness meanwhile (a follower is alive, not broken)."""
    from kvgate.adapters import leader

    lease_ns = (
        args.lease_namespace
        or os.environ.get("KVGATE_NAMESPACE")
        or (namespaces[0] if namespaces else "default")
    )
    settings = leader.LeaseSettings(
        namespace=lease_ns,
        name=leader.lease_name(namespaces, bool(args.all_namespaces)),
        lease_duration_s=_seconds("KVGATE_LEASE_DURATION", 15),
        renew_deadline_s=_seconds("KVGATE_LEASE_RENEW_DEADLINE", 10),
        retry_period_s=_seconds("KVGATE_LEASE_RETRY_PERIOD", 2),
    )
    server = _liveness_while_waiting(args.liveness)
    try:
        leader.wait_for_leadership(settings)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _seconds(name: str, default: int) -> int:
    from kvgate.errors import SpecError

    raw = os.environ.get(name)
    if not raw:
        return default
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= 3600:
        raise SpecError(name, f"{raw!r} is not a whole number of seconds in [1, 3600]")
    return int(raw)


def _liveness_while_waiting(url: str | None) -> Any:
    """A bare /healthz on kopf's liveness address until kopf serves its own."""
    if not url:
        return None
    import http.server
    import threading
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    path = parts.path or "/healthz"

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == path
            body = b'{"leader": false}' if ok else b""
            self.send_response(200 if ok else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        (parts.hostname or "0.0.0.0", parts.port or 8080), Health
    )
    threading.Thread(target=server.serve_forever, name="kvgate-liveness", daemon=True).start()
    return server
