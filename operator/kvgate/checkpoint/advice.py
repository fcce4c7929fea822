"""When does vLLM itself say to avoid an FP8 KV cache? Its 2026 FP8 study, as preflight advice.

vLLM's blog "The State of FP8 KV-Cache and Attention Quantization in vLLM" (2026-04-22, Red Hat AI
and AWS; vllm-project/vllm-project.github.io PR #195; kv-policy.md section 2.2) lists when to
avoid FP8: typical contexts under about 7k tokens (the decode break-even on H100 with
Llama-3.1-8B), head_dim 256 with a prefill-sensitive objective (FA3's two-level accumulation
costs about 1.6x prefill TTFT there), and many small sliding-window layers (gpt-oss-20b is best
with `--kv-cache-dtype-skip-layers sliding_window`, +4.8%). Each note below states its figure and
that source; none is a gate, only what to weigh before a rollout. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

STUDY: Final = (
    "vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in vLLM' (2026-04-22), "
    "'When to avoid FP8'"
)
BREAK_EVEN_TOKENS: Final = 7000  # decode break-even, H100, Llama-3.1-8B
TTFT_HEAD_DIM: Final = 256
TTFT_COEFFICIENT: Final = 1.6


@dataclass(frozen=True, slots=True)
class Guidance:
    code: str
    message: str
    source: str = STUDY

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "source": self.source}


def fp8_guidance(
    *,
    head_dim: int | None,
    sliding_window_layers: int,
    kv_layers: int,
    typical_context: int | None = None,
    ttft_objective: bool = False,
    skip_layers: tuple[str, ...] = (),
) -> tuple[Guidance, ...]:
    """The study's notes that apply to this model and workload (`typical_context`: prompt plus
    output tokens of a typical request, None: unknown; `ttft_objective`: a TTFT SLO is set)."""
    notes: list[Guidance] = []
    if typical_context is not None and typical_context < BREAK_EVEN_TOKENS:
        notes.append(
            Guidance(
                "ShortContexts",
                f"typical contexts of {typical_context:,} tokens are under the ~7k-token decode "
                "break-even vLLM measured (H100, Llama-3.1-8B): expect FP8 to buy pool capacity, "
                "not faster decoding",
            )
        )
    if head_dim == TTFT_HEAD_DIM and ttft_objective:
        notes.append(
            Guidance(
                "HeadDim256Ttft",
                f"head_dim {TTFT_HEAD_DIM} with a TTFT objective: FA3's two-level accumulation "
                f"costs about {TTFT_COEFFICIENT:g}x prefill TTFT at this head size under FP8; "
                "measure TTFT on both arms (throughputGain.ttftP99Ms) before promoting",
            )
        )
    if sliding_window_layers and "sliding_window" not in skip_layers:
        share = f"{sliding_window_layers} of {kv_layers}" if kv_layers else sliding_window_layers
        notes.append(
            Guidance(
                "SlidingWindowLayers",
                f"{share} layers are sliding-window: keep them in 16 bits with "
                "`kvCache.skipLayers: [sliding_window]` (--kv-cache-dtype-skip-layers "
                "sliding_window; gpt-oss-20b measured +4.8% with it)",
            )
        )
    return tuple(notes)
