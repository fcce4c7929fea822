"""`kvgate abort NAME --reason TEXT`: stop a rollout; production is reverted if it was patched."""

from __future__ import annotations

import argparse
from typing import Final

from kvgate.commands.rollout_view import RolloutView, name_arguments
from kvgate.errors import SpecError
from kvgate.vocabulary import ANNOTATION_ABORT

EXAMPLES: Final = ('kvgate abort vllm-fp8 -n llm --reason "freeze for the launch"',)

_MAX_REASON = 200  # what the operator keeps of it (approval.abort_text)


def configure(parser: argparse.ArgumentParser) -> None:
    name_arguments(parser)
    parser.add_argument("--reason", required=True, help="why, one line (kept in status, Events)")


def run(args: argparse.Namespace) -> int:
    from kvgate.adapters.kube_cli import for_cli

    reason = " ".join(str(args.reason).split())
    if not reason or not reason.isprintable() or len(reason) > _MAX_REASON:
        raise SpecError("--reason", f"give one printable line of at most {_MAX_REASON} characters")
    kube, ns = for_cli(args.namespace)
    view = RolloutView.of(kube.get_rollout(ns, args.name))
    if view.status.ended:
        raise SpecError(f"kvr/{args.name}", f"has ended ({view.phase.value}): nothing to abort")
    kube.annotate_rollout(ns, view.name, {ANNOTATION_ABORT: reason})
    print(
        f"abort requested for kvr/{view.name} in {ns} ({reason}); it ends RolledBack, after "
        f"reverting production if kvgate had patched it (kvgate wait {view.name} -n {ns})"
    )
    return 0
