"""inference-perf's run config, written as data (the tool's YAML schema, 0.7.0).

A `LoadPlan` says what to run against one arm; `inference_perf_config` turns it into the
mapping inference-perf reads with `--config_file`. Every stage is a `concurrent` stage of
fixed-length requests with `ignore_eos`, so each successful request must return exactly
`output_tokens` tokens (the report judge relies on that to spot cut-off streams).

Prompts are random tokens. By default they are made before the first stage (the tool's
`shared_prefix` generator with one group per request, so no two prompts share a prefix):
its `random` generator makes each prompt when the request is sent, which on a busy CPU
spreads a stage's sends over seconds (measured: 5 s for 32 prompts of 20k tokens) and the
stage then measures the client. `pregenerate_prompts=False` gives the `random` generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ServerType = Literal["vllm", "sglang"]
PERCENTILES = (50, 90, 99)
QUESTION_TOKENS = 16  # the per-request part after the pregenerated prompt's unique "prefix"


class LoadPlanError(ValueError):
    """A plan the tool would reject or run meaninglessly; the message names the field."""


@dataclass(frozen=True)
class Stage:
    """`num_requests` requests, at most `concurrency` in flight."""

    concurrency: int
    num_requests: int


@dataclass(frozen=True)
class Slo:
    """Goodput constraints in seconds (inference-perf's `report.goodput.constraints`)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True)
class LoadPlan:
    base_url: str
    model_name: str  # always set: without it the tool asks /v1/models with no timeout
    tokenizer_dir: str
    report_dir: str
    stages: tuple[Stage, ...]
    prompt_tokens: int
    output_tokens: int
    num_workers: int  # explicit: the tool's default is the node's CPU count
    prompt_std_tokens: int = 0
    server_type: ServerType = "vllm"
    request_timeout_s: float = 60.0
    stage_grace_s: float = 10.0
    interval_s: float = 1.0
    seed: int = 42
    slo: Slo | None = None
    pregenerate_prompts: bool = True

    def __post_init__(self) -> None:
        if not self.stages:
            raise LoadPlanError("stages: at least one stage")
        for number, stage in enumerate(self.stages):
            if stage.concurrency < 1 or stage.num_requests < 1:
                raise LoadPlanError(
                    f"stages[{number}]: concurrency and num_requests must be >= 1, got "
                    f"{stage.concurrency} and {stage.num_requests}"
                )
        least = {"prompt_tokens": 1, "output_tokens": 1, "num_workers": 1, "prompt_std_tokens": 0}
        for name, low in least.items():
            if getattr(self, name) < low:
                raise LoadPlanError(f"{name}: must be >= {low}, got {getattr(self, name)}")
        if self.request_timeout_s <= 0:
            raise LoadPlanError(f"request_timeout_s: must be > 0, got {self.request_timeout_s}")
        if self.pregenerate_prompts and self.prompt_tokens - 2 * self.prompt_std_tokens <= (
            QUESTION_TOKENS
        ):
            raise LoadPlanError(
                f"prompt_tokens: {self.prompt_tokens} (std {self.prompt_std_tokens}) is too short "
                f"for pregenerated prompts (more than {QUESTION_TOKENS} tokens)"
            )
        if not self.model_name:
            raise LoadPlanError("model_name: must be set")

    def prompt_bounds(self) -> tuple[int, int]:
        """The shortest and longest prompt the plan asks for, in the load tokenizer's tokens:
        with the served model's tokenizer, the engine counts each prompt within them."""
        spread = 2 * self.prompt_std_tokens
        return max(1, self.prompt_tokens - spread), self.prompt_tokens + spread


def _prompt_distribution(plan: LoadPlan, tokens: int) -> dict[str, Any]:
    if plan.prompt_std_tokens == 0:
        return _fixed(tokens)
    spread = 2 * plan.prompt_std_tokens
    return {
        "type": "normal",
        "mean": tokens,
        "std_dev": plan.prompt_std_tokens,
        "min": max(1, tokens - spread),
        "max": tokens + spread,
    }


def _data(plan: LoadPlan) -> dict[str, Any]:
    if not plan.pregenerate_prompts:
        return {
            "type": "random",
            "input_distribution": _prompt_distribution(plan, plan.prompt_tokens),
            "output_distribution": _fixed(plan.output_tokens),
        }
    return {
        "type": "shared_prefix",
        "shared_prefix": {
            "num_groups": sum(stage.num_requests for stage in plan.stages),
            "num_prompts_per_group": 1,
            "system_prompt_len": _prompt_distribution(plan, plan.prompt_tokens - QUESTION_TOKENS),
            "question_len": QUESTION_TOKENS,
            "output_len": plan.output_tokens,
            "seed": plan.seed,
        },
    }


def _fixed(tokens: int) -> dict[str, Any]:
    return {"type": "fixed", "mean": tokens, "std_dev": 0, "min": tokens, "max": tokens}


def inference_perf_config(plan: LoadPlan) -> dict[str, Any]:
    """The mapping for `inference-perf --config_file` (unknown keys are refused by the tool)."""
    report: dict[str, Any] = {
        "request_lifecycle": {
            "summary": True,
            "per_stage": True,
            # each response's streamed pieces and usage, read for what the output holds
            # (kvgate.load.output): the raw SSE body and the usage, not the prompts
            "per_request": True,
            "per_request_fields": {
                "request": False,
                "response": True,
                "info": True,
                "response_chunks": False,  # the same pieces are in the response body
                "computed_metrics": False,
            },
            "percentiles": list(PERCENTILES),
            # tok/s and TPOT from the engine's own count of each response (usage, a count of
            # decode steps), not the client re-tokenizing the streamed text: on real vLLM a
            # random model's output, re-tokenized by the served model's own tokenizer, counted
            # 6,102 tokens where the engine generated 5,120 (bench/RESULTS-real-engine.md).
            "use_server_output_tokens": True,
        }
    }
    if plan.slo is not None:
        constraints = {
            key: value
            for key, value in (("ttft", plan.slo.ttft_s), ("tpot", plan.slo.tpot_s))
            if value is not None
        }
        if constraints:
            report["goodput"] = {"constraints": constraints}
    return {
        "api": {"type": "completion", "streaming": True},
        "server": {
            "type": plan.server_type,
            "base_url": plan.base_url,
            "model_name": plan.model_name,
            "ignore_eos": True,
        },
        "tokenizer": {"pretrained_model_name_or_path": plan.tokenizer_dir, "load_timeout": 60},
        "data": _data(plan),
        "load": {
            "type": "concurrent",
            "num_workers": plan.num_workers,
            "interval": plan.interval_s,
            "request_timeout": plan.request_timeout_s,
            "stage_teardown_grace_seconds": plan.stage_grace_s,
            "base_seed": plan.seed,
            "stages": [
                {"num_requests": stage.num_requests, "concurrency_level": stage.concurrency}
                for stage in plan.stages
            ],
        },
        "report": report,
        "storage": {"local_storage": {"path": plan.report_dir}},
    }
