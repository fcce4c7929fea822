"""Can the candidate be called faster? What its output held and whether it kept its prefix cache.

The throughput gate asks this before any tok/s: a candidate refused here is Failed with its own
reason, whatever it measured.
- OutputDegenerate: its responses are not the length asked (usage against max_tokens, or more
  streamed pieces than the usage counts), or it repeats the piece before it in a share of its
  output more than `REPEAT_EXCESS` above the control's (an FP8 KV bug that emitted every second
  token twice measured faster: intel/llm-scaler#721). Compared with the control, because a
  random or small model loops on both arms alike.
- PrefixCacheOff: the control's prefix cache hits the probe's repeated prompt and the
  candidate's hits less than `PREFIX_FLOOR` of that rate, or cache_config_info says it is off on
  the candidate and on on the control (FP8 KV that left vLLM with prefix caching off re-prefilled
  about 96k tokens per agent step: rwlove/home-ops#13384). The load itself shares no prefix, so
  the probe is the only place a lost prefix cache shows.
  SGLang arms alike: its prompt/cached token counters and /server_info's disable_radix_cache
  (kvgate.evidence.metrics.COUNTERS cites the wheel).
Arms without the figures (an older load Job, an engine without --enable-metrics, a probe that
failed) are not judged by the rule that needs them. Pure.
"""

from __future__ import annotations

from typing import Final

from kvgate.reasons import Reason
from kvgate.records.loadresult import SGLANG_SWITCH, ArmLoad, OutputFigures, PrefixProbe

REPEAT_EXCESS: Final = 0.10  # share of output pieces repeating the one before, over the control's
PREFIX_FLOOR: Final = 0.5  # the candidate's probe hit rate at least this share of the control's


def output_problem(control: OutputFigures | None, candidate: OutputFigures | None) -> str | None:
    """Why the candidate's output is degenerate (None: it is not, or it was not read)."""
    if candidate is None or not candidate.requests:
        return None
    example = f' (e.g. "{candidate.example}")' if candidate.example else ""
    if candidate.wrong_length:
        return (
            f"{candidate.wrong_length} of {candidate.requests} candidate responses are not the "
            f"length asked{example}"
        )
    mine = candidate.repeated_share
    theirs = control.repeated_share if control is not None else None
    if mine is not None and mine - (theirs or 0.0) > REPEAT_EXCESS:
        versus = f", the control {theirs:.0%}" if theirs is not None else ""
        return (
            f"the candidate repeats the token before it in {mine:.0%} of its output "
            f"({candidate.repeated:,} of {candidate.pieces:,} pieces){versus}{example}"
        )
    return None


def prefix_problem(control: PrefixProbe | None, candidate: PrefixProbe | None) -> str | None:
    """Why the candidate's prefix caching is off where the control's is on (None: it is not, or
    nothing to compare)."""
    if control is None or candidate is None or control.error or candidate.error:
        return None
    if control.enabled is True and candidate.enabled is False:
        if candidate.switch == SGLANG_SWITCH:
            return (
                "server_info says disable_radix_cache true on the candidate, false on the control"
            )
        return (
            "cache_config_info says enable_prefix_caching False on the candidate, True on the "
            "control"
        )
    theirs, mine = control.hit_rate, candidate.hit_rate
    if theirs is None or mine is None or theirs <= 0:
        return None
    if mine < theirs * PREFIX_FLOOR:
        return (
            f"the candidate's prefix cache hit {mine:.0%} of the probe's prompt tokens, the "
            f"control's {theirs:.0%}: prefix caching is off on the candidate"
        )
    return None


def refusal(control: ArmLoad, candidate: ArmLoad) -> tuple[Reason, str] | None:
    """The reason and one line why the candidate cannot be called faster (None: it may be)."""
    output = output_problem(control.output, candidate.output)
    if output is not None:
        return Reason.OUTPUT_DEGENERATE, f"not counted as faster: {output}"
    prefix = prefix_problem(control.prefix_cache, candidate.prefix_cache)
    if prefix is not None:
        return Reason.PREFIX_CACHE_OFF, f"not counted as faster: {prefix}"
    return None
