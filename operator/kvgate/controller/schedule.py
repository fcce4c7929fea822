"""When does a rollout's next reconcile run? Kept in memory per rollout (kopf's per-object memo).

A rollout is polled by a kopf timer that ticks every second and reconciles only when due: when
the delay the core chose has passed, or at once when its spec changed (a new generation). A
reconcile that changes nothing writes nothing, so a poll costs the reads it makes and no PATCH
(kopf's TemporaryError requeue cost two: its progress annotations, then a touch to wake the
handler). Lost on a restart, which reconciles every rollout at once, as kopf's resume did.

A timer's body is the last one kopf's watch delivered, so after a write the next reconcile waits
until the write has come back (a new resourceVersion): it never decides on a status older than
its own last write. A write the watch never returns (a lost event) is waited for at most
`WRITE_WAIT_S`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Final

WRITE_WAIT_S: Final = 30.0


@dataclass
class Schedule:
    due_at: float = 0.0  # monotonic seconds; 0: at once
    generation: int | None = None  # the spec generation the last reconcile ran on
    ran: bool = False
    written_on: str | None = None  # the resourceVersion the last write was made on
    written_at: float = 0.0
    # one reconcile (or cleanup) of a rollout at a time
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def due(self, now: float, generation: int | None, version: str | None) -> bool:
        """Whether to reconcile now, on a body with this generation and resourceVersion."""
        if self.written_on is not None:
            if version == self.written_on and now - self.written_at < WRITE_WAIT_S:
                return False  # our last write has not come back yet
            self.written_on = None
        if not self.ran or generation != self.generation:
            return True  # first sight, or a new spec
        return now >= self.due_at

    def ran_on(
        self, now: float, generation: int | None, version: str | None, *,
        delay: float | None, wrote: bool,
    ) -> None:  # fmt: skip
        """A reconcile ran on this body: the next is due after `delay` (None: only on a new
        spec), and not before its write (if any) has come back."""
        self.ran = True
        self.generation = generation
        self.due_at = math.inf if delay is None else now + max(delay, 0.0)
        if wrote:
            self.written_on, self.written_at = version, now


_CREATING: Final = threading.Lock()


def schedule_of(memo: object) -> Schedule:
    """The rollout's schedule in its per-object memo, made on first use (by one thread)."""
    with _CREATING:
        found = getattr(memo, "schedule", None)
        if not isinstance(found, Schedule):
            found = Schedule()
            setattr(memo, "schedule", found)  # noqa: B010 (kopf.Memo takes any attribute)
        return found
