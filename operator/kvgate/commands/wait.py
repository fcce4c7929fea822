"""`kvgate wait NAME`: block until a rollout ends; the exit code is its answer."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Final

from kvgate.commands.exit_codes import EXIT_INCONCLUSIVE
from kvgate.commands.rollout_view import RolloutView, name_arguments
from kvgate.errors import SpecError
from kvgate.inputs import duration_seconds

EXAMPLES: Final = ("kvgate wait vllm-fp8 -n llm --timeout 2h && echo promoted",)


def configure(parser: argparse.ArgumentParser) -> None:
    name_arguments(parser)
    parser.add_argument("--timeout", default="90m", help="give up after this long")
    parser.add_argument("--interval", default="5s", help="time between reads of the rollout")


def durations(args: argparse.Namespace) -> tuple[float, float]:
    found = []
    for flag, text in (("--timeout", args.timeout), ("--interval", args.interval)):
        try:
            found.append(duration_seconds(text))
        except ValueError as exc:
            raise SpecError(flag, str(exc)) from None
    timeout, interval = found
    if interval <= 0:
        raise SpecError("--interval", f"{args.interval} must be above 0")
    return timeout, interval


def run(args: argparse.Namespace) -> int:
    from kvgate.adapters.kube_cli import for_cli

    timeout, interval = durations(args)
    kube, namespace = for_cli(args.namespace)
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        view = RolloutView.of(kube.get_rollout(namespace, args.name))
        headline = view.headline()
        if headline != last and sys.stderr.isatty():
            print(headline, file=sys.stderr)
        last = headline
        if view.status.ended:
            print(headline)
            return view.exit_code()
        if time.monotonic() + interval > deadline:
            print(f"{headline} (still running after {args.timeout})")
            return EXIT_INCONCLUSIVE
        time.sleep(interval)
