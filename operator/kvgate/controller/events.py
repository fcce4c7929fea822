"""How is an Event posted? On the rollout, scrubbed, counted and logged. `record` alone calls
this: stages return their Events in a `StatusUpdate`, the handlers beside reconcile hand theirs
to `record.post_events`.
"""

from __future__ import annotations

import kopf

from kvgate import redact
from kvgate.controller.context import Ctx
from kvgate.controller.telemetry import EVENTS
from kvgate.reasons import Reason


def post_event(ctx: Ctx, reason: Reason, message: str, *, warning: bool) -> None:
    type_ = "Warning" if warning else "Normal"
    message = redact.scrub_text(message)  # Events are readable by anyone who reads the namespace
    kopf.event(ctx.rollout.owner(), type=type_, reason=reason, message=message[:1000])
    EVENTS.labels(ctx.namespace, ctx.name, type_, reason).inc()
    ctx.logger.info("event %s: %s", reason, message, extra={"reason": reason})
