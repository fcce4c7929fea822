"""How much accuracy may a KV policy give up? The accuracy margin by policy class (issue 39).

- FP8 and per-(token, head) formats (`kvgate.engines.kvformats` classes `fp8`, `per-token-head`) keep
  the non-inferiority question: the candidate may be at most `DEFAULT_MARGIN_PP` percentage
  points of GSM8K accuracy below the control, shown by the one-sided bound at the gate's
  confidence. The default is an *absolute* margin (2 points), not a recovery ratio: vLLM's FP8
  study (kv-policy.md, 2.2) avoids FP8 below 95% recovery, which at a control near 90% is a loss
  of about 4.5 points; 2 points is the stricter of the two there.
- Sub-8-bit formats (class `sub-8-bit`: int4, FP4/NVFP4, TurboQuant, UltraQuant, Octave) trade
  accuracy for capacity on purpose (TurboQuant: 4 to 18 GSM8K points, vllm#38479), so no
  default fits: the spec states the loss it accepts (`spec.gates.accuracy.margin`), up to
  `MAX_SUB8BIT_MARGIN_PP`, and keeps the accuracy gate on. The verdict then reports both sides
  (`kvgate.judge.tradeoff`): the accuracy given up, bounded, and the capacity and throughput bought,
  measured.

Pure: data in, data out. The CRD states the same rules in CEL (`tests/unit/test_margins.py`
checks that its format list is `SUB8BIT_FORMATS`).
"""

from __future__ import annotations

from typing import Final

from kvgate.engines import kvformats

# The one default margin, in percentage points of accuracy (spec.gates.accuracy.margin).
DEFAULT_MARGIN_PP: Final = 2.0
MAX_MARGIN_PP: Final = 10.0  # FP8 and per-token-head formats
MAX_SUB8BIT_MARGIN_PP: Final = 50.0  # a stated trade: TurboQuant 3-bit loses about 18 points
MARGIN_FIELD: Final = "gates.accuracy.margin"
# Every format name of the sub-8-bit class, either engine (the CRD's CEL list).
SUB8BIT_FORMATS: Final = tuple(
    sorted({f.name for f in kvformats.FORMATS.values() if f.policy_class == kvformats.SUB8BIT})
)


def max_margin_pp(policy_class: str) -> float:
    """The largest margin a candidate of this class may state."""
    return MAX_SUB8BIT_MARGIN_PP if needs_stated_margin(policy_class) else MAX_MARGIN_PP


def needs_stated_margin(policy_class: str) -> bool:
    """Whether a candidate of this class must state its margin (no default applies)."""
    return policy_class == kvformats.SUB8BIT


def margin_problems(
    policy_class: str, format_name: str, margin_pp: float | None, accuracy_on: bool
) -> list[tuple[str, str]]:
    """(field, message) for every margin rule the spec breaks; `margin_pp` None: not stated.
    Its range by class (`max_margin_pp`) is the spec reader's, which names it."""
    if not needs_stated_margin(policy_class):
        return []
    unstated = (
        MARGIN_FIELD,
        f"is required for the sub-8-bit KV format '{format_name}': it trades accuracy for "
        "capacity on purpose, so state the loss you accept in percentage points (e.g. 6); no "
        "default applies",
    )
    off = (
        "gates.accuracy.mode",
        f"off is refused for the sub-8-bit KV format '{format_name}': the accuracy it gives up "
        "must be measured and bounded; use require",
    )
    return [
        problem
        for problem, broken in ((unstated, margin_pp is None), (off, not accuracy_on))
        if broken
    ]
