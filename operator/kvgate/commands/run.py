"""`kvgate run`: run the KVCacheRollout operator (kopf) in the foreground."""

from __future__ import annotations

import argparse
import os

from kvgate.config import OperatorConfig

HELP = "run the KVCacheRollout operator"

_LOG_FORMATS = ("plain", "full", "json")


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; globs allowed)",
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
        help="serve the operator's Prometheus /metrics on this port (0: off; env KVGATE_METRICS_PORT)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="seconds between checks of a waiting rollout (env KVGATE_POLL_INTERVAL)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-format", choices=_LOG_FORMATS, default="full")
    parser.add_argument("--json", action="store_true", help="same as --log-format=json")


def run(args: argparse.Namespace) -> int:
    import kopf

    import kvgate.handlers  # noqa: F401  (registers the handlers)

    # Flags override the environment, which overrides the defaults; built once, here.
    config = OperatorConfig.from_env(os.environ).with_overrides(
        metrics_port=args.metrics_port, poll_interval_s=args.poll_interval
    )
    log_format = "json" if args.json else args.log_format
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[log_format.upper()])
    namespaces = list(args.namespace)
    if not namespaces and not args.all_namespaces:
        namespaces = [os.environ.get("KVGATE_NAMESPACE") or "default"]
    kopf.run(
        standalone=True,  # one replica (Recreate): kopf peering is not leader election
        clusterwide=bool(args.all_namespaces),
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(config=config),
    )
    return 0
