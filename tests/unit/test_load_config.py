"""The inference-perf config kvgate writes: what the tool reads, and plans it refuses."""

from __future__ import annotations

import pytest

from kvgate.load.config import LoadPlan, LoadPlanError, Slo, Stage, inference_perf_config


def plan(**changes: object) -> LoadPlan:
    fields: dict[str, object] = dict(
        base_url="http://127.0.0.1:8000",
        model_name="Qwen/Qwen3-8B",
        tokenizer_dir="/tok",
        report_dir="/reports/control",
        stages=(Stage(1, 4), Stage(32, 64)),
        prompt_tokens=512,
        output_tokens=128,
        num_workers=2,
    )
    fields.update(changes)
    return LoadPlan(**fields)  # type: ignore[arg-type]


def test_config_names_the_model_sets_workers_and_fixed_outputs() -> None:
    config = inference_perf_config(plan(prompt_std_tokens=64, slo=Slo(ttft_s=0.5)))
    assert config["server"] == {
        "type": "vllm",
        "base_url": "http://127.0.0.1:8000",
        "model_name": "Qwen/Qwen3-8B",
        "ignore_eos": True,
    }
    assert config["api"] == {"type": "completion", "streaming": True}
    load = config["load"]
    assert load["type"] == "concurrent" and load["num_workers"] == 2
    assert load["stages"] == [
        {"num_requests": 4, "concurrency_level": 1},
        {"num_requests": 64, "concurrency_level": 32},
    ]
    # prompts made before the first stage: one unique "prefix" per request of all stages
    assert config["data"] == {
        "type": "shared_prefix",
        "shared_prefix": {
            "num_groups": 68,
            "num_prompts_per_group": 1,
            "system_prompt_len": {
                "type": "normal", "mean": 496, "std_dev": 64, "min": 368, "max": 624,
            },
            "question_len": 16,
            "output_len": 128,
            "seed": 42,
        },
    }  # fmt: skip
    assert config["report"]["goodput"] == {"constraints": {"ttft": 0.5}}
    assert config["report"]["request_lifecycle"]["per_stage"] is True
    assert config["storage"] == {"local_storage": {"path": "/reports/control"}}
    assert "goodput" not in inference_perf_config(plan())["report"]
    fixed = inference_perf_config(plan())["data"]["shared_prefix"]["system_prompt_len"]
    assert fixed == {"type": "fixed", "mean": 496, "std_dev": 0, "min": 496, "max": 496}


def test_prompts_made_at_send_time_use_the_random_generator() -> None:
    data = inference_perf_config(plan(pregenerate_prompts=False, prompt_std_tokens=64))["data"]
    assert data["type"] == "random"
    assert data["input_distribution"] == {
        "type": "normal", "mean": 512, "std_dev": 64, "min": 384, "max": 640,
    }  # fmt: skip
    assert data["output_distribution"]["min"] == data["output_distribution"]["max"] == 128


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"stages": ()}, "stages: at least one stage"),
        ({"stages": (Stage(0, 4),)}, "stages[0]: concurrency and num_requests must be >= 1"),
        ({"num_workers": 0}, "num_workers: must be >= 1, got 0"),
        ({"output_tokens": 0}, "output_tokens: must be >= 1, got 0"),
        ({"model_name": ""}, "model_name: must be set"),
        ({"request_timeout_s": 0}, "request_timeout_s: must be > 0"),
        ({"prompt_tokens": 16}, "prompt_tokens: 16 .std 0. is too short for pregenerated prompts"),
    ],
)
def test_bad_plans_are_refused_naming_the_field(changes: dict[str, object], message: str) -> None:
    with pytest.raises(LoadPlanError, match=message.replace("[0]", r"\[0\]")):
        plan(**changes)
