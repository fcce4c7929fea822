"""lm-eval's stock GSM8K tasks against kvgate.sim: its filters read the sim's answers as meant.

Runs the real `lm_eval` CLI offline (local JSON data, as the eval Job does) for the 5-shot
gsm8k and 8-shot gsm8k_cot tasks over completions and chat. With accuracy 1.0 every
answer must score, with 0.0 none may: both the strict and the flexible filter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lm_eval
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lmeval, pytest.mark.timeout(600)]

MODEL = "Qwen/Qwen3-8B"
SERVE = ["vllm", "serve", MODEL, "--max-model-len", "8192", "--attention-backend", "TRITON_ATTN"]
STOCK = Path(lm_eval.__file__).parent / "tasks" / "gsm8k"
DATA = Path(
    os.environ.get("KVGATE_GSM8K_DIR") or Path(__file__).resolve().parents[3] / "shared/data/gsm8k"
)


def _tasks(directory: Path) -> Path:
    (directory / "gsm8k_sim.yaml").write_text(
        f"include: {STOCK / 'gsm8k.yaml'}\ntask: gsm8k_sim\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    train: {DATA / 'train.jsonl'}\n    test: {DATA / 'test.jsonl'}\n"
    )
    (directory / "gsm8k_cot_sim.yaml").write_text(
        f"include: {STOCK / 'gsm8k-cot.yaml'}\ntask: gsm8k_cot_sim\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {DATA / 'test.jsonl'}\n"
    )
    return directory


def _run(engine, tmp_path: Path, chat: bool) -> dict[str, dict[str, float]]:
    out = tmp_path / ("chat" if chat else "completions")
    if chat:
        model = [
            "--model",
            "local-chat-completions",
            "--apply_chat_template",
            "--fewshot_as_multiturn",
        ]
        args = f"model={MODEL},base_url={engine.url}/v1/chat/completions,num_concurrent=8,max_retries=1"
    else:
        model = ["--model", "local-completions"]
        args = (
            f"model={MODEL},base_url={engine.url}/v1/completions,tokenizer_backend=none,"
            "tokenized_requests=False,num_concurrent=8,max_retries=1"
        )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    subprocess.run(
        [sys.executable, "-m", "lm_eval", *model, "--model_args", args + ",max_gen_toks=512",
         "--include_path", str(_tasks(tmp_path)), "--tasks", "gsm8k_sim,gsm8k_cot_sim", "--limit", "25",
         "--output_path", str(out)],
        check=True, env=env, cwd=tmp_path, capture_output=True, timeout=500,
    )  # fmt: skip
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    return {
        task: {k: v for k, v in row.items() if k.startswith("exact_match,")}
        for task, row in results.items()
    }


# two of the four combinations: lm-eval takes ~30 s to start on this machine
@pytest.mark.parametrize(
    ("chat", "accuracy"),
    [(False, "1.0"), (True, "0.0")],
    ids=["completions-all-right", "chat-all-wrong"],
)
def test_lm_eval_scores_what_the_sim_decided(
    sim, tmp_path: Path, chat: bool, accuracy: str
) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_ACCURACY": accuracy})
    scores = _run(engine, tmp_path, chat)
    assert set(scores) == {"gsm8k_sim", "gsm8k_cot_sim"}
    for task, metrics in scores.items():
        assert set(metrics) == {"exact_match,strict-match", "exact_match,flexible-extract"}, task
        for name, score in metrics.items():
            assert score == float(accuracy), (task, name, score)
