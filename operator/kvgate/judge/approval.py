"""Does this approval (or abort) annotation count?"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """The approval annotations of a rollout (see `model.ANNOTATION_*`)."""

    approve: str | None = None  # kvgate.io/approve: the config hash approved
    created_by: str | None = None
    approved_by: str | None = None
    approved_generation: str | None = None
    abort: str | None = None
    aborted_by: str | None = None


def read_approval(
    record: ApprovalRecord, generation: int | None, *, require_identity: bool
) -> tuple[str | None, str, str]:
    """(the approved hash if the approval counts, the approver, why it does not count).

    The chart's admission policies record the approver and the generation an approval was
    given at, and refuse the author's own approval; this is the operator's second wall. An
    approval counts only for the generation (the run) it was given for, never when the
    recorded approver is the recorded author, and, with `require_identity` (the policy is
    installed), only with both recorded.
    """
    if not record.approve:
        return None, "", ""
    by = record.approved_by or ""
    if by and record.created_by and by == record.created_by:
        return None, by, f"approval by {by} ignored: {by} created this rollout"
    if require_identity and not (by and record.created_by and record.approved_generation):
        why = (
            "approval ignored: it carries no approver or author recorded by the apiserver "
            "(kvgate.io/approved-by, kvgate.io/created-by); re-approve with the approval "
            "policy installed"
        )
        return None, by, why
    given = record.approved_generation
    if given is not None and given != str(generation):
        why = (
            f"approval ignored: it was given for generation {given}, the spec is now "
            f"generation {generation}; approve again"
        )
        return None, by, why
    return record.approve, by, ""


def abort_text(record: ApprovalRecord) -> str | None:
    """One line saying who aborted and why, from kvgate.io/abort; None when not set."""
    if not record.abort:
        return None
    why = " ".join(record.abort.split())[:200]
    who = f" by {record.aborted_by}" if record.aborted_by else ""
    return f"aborted{who} (kvgate.io/abort: {why})"
