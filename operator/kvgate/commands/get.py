"""`kvgate get NAME [--watch]`: a rollout's phase, gates, eval progress and recent Events."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Final

from kvgate.commands.rollout_view import RolloutView, name_arguments
from kvgate.commands.wait import durations

EXAMPLES: Final = ("kvgate get vllm-fp8 -n llm --watch",)


def configure(parser: argparse.ArgumentParser) -> None:
    name_arguments(parser)
    parser.add_argument(
        "-w", "--watch", action="store_true", help="print again on each change until it ends"
    )
    parser.add_argument("--timeout", default="90m", help="with --watch: stop after")
    parser.add_argument("--interval", default="5s", help="with --watch: time between reads")
    parser.add_argument("--json", action="store_true", help="print the typed status as JSON")


def run(args: argparse.Namespace) -> int:
    from kvgate.adapters.kube_cli import for_cli

    timeout, interval = durations(args)
    kube, namespace = for_cli(args.namespace)
    deadline = time.monotonic() + timeout
    shown: list[str] = []
    while True:
        view = RolloutView.of(kube.get_rollout(namespace, args.name))
        if args.json:
            print(json.dumps({"name": view.name, "namespace": view.namespace,
                              "status": view.status.to_dict()}, sort_keys=True))  # fmt: skip
        else:
            lines = view.lines(kube.rollout_events(view.namespace, view.name))
            if lines != shown:  # --watch prints what changed, not the same screen again
                if shown:
                    print()
                print("\n".join(lines), flush=True)
                shown = lines
        if not args.watch or view.status.ended:
            return view.exit_code() if args.watch else 0
        if time.monotonic() + interval > deadline:  # said, as wait says it (first-hour-2 N23)
            print(
                f"stopped watching after {args.timeout}; still {view.phase.value}", file=sys.stderr
            )
            return view.exit_code()
        time.sleep(interval)
