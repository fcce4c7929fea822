"""spec.kvCache.skipLayers with several entries (issue 39): read entry by entry (a hostile entry is
one line naming `spec.kvCache.skipLayers[i]`), written into the candidate as vLLM's parser takes
a list, promoted to production and undone exactly, and sized by the capacity math.

vLLM's flag is `nargs="+"` (vllm/engine/arg_utils.py:252 and :1384, 0.32.0). Its real parser
(the CPU build's FlexibleArgumentParser with EngineArgs.add_cli_args, run 2026-12-06) gave:
`--kv-cache-dtype-skip-layers 0 1 sliding_window` -> ['0', '1', 'sliding_window'];
`--kv-cache-dtype-skip-layers=0 1` -> "error: unrecognized arguments: 1";
`--kv-cache-dtype-skip-layers=0,1` -> ['0,1'] (one entry; attention.py:312 compares
`str(layer_idx)`, so it skips nothing); the flag twice -> the last ('Found duplicate keys').
`vllm_parse` below is that parser's shape (tests/realengine/test_skip_layers_real_vllm.py runs
the real one on what kvgate writes).
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import jsonpatch
import pytest

from kvgate.change import container as promotion
from kvgate.change.manifests import candidate_container
from kvgate.checkpoint.capacity import MAX_LAYERS, parse_kv_layout
from kvgate.checkpoint.formats import expected_capacity_gain
from kvgate.controller.sources import _skip_layers_problem
from kvgate.engines import launch as engines
from kvgate.spec.kvcache import MAX_LAYERS as POLICY_MAX_LAYERS
from kvgate.spec.kvcache import MAX_SKIP_ENTRIES
from kvgate.spec.rollout import RolloutSpec

FLAG = "--kv-cache-dtype-skip-layers"


def spec(**kv: Any) -> dict[str, Any]:
    return {
        "targetRef": {"name": "qwen", "container": "engine"},
        "engine": "vllm",
        "kvCache": {"format": "fp8", **kv},
    }


def errors(raw: dict[str, Any]) -> list[str]:
    try:
        RolloutSpec.from_dict(raw)
    except ExceptionGroup as group:
        return [str(e) for e in group.exceptions]
    return []


def vllm_parse(tokens: list[str]) -> argparse.Namespace:
    """The engine arguments as vLLM 0.32's parser reads them (see the module docstring)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("model", nargs="?")
    parser.add_argument("--kv-cache-dtype")
    parser.add_argument(FLAG, type=str, nargs="+", default=[])
    parser.add_argument("--max-num-seqs")
    parser.add_argument("--block-size")
    # FlexibleArgumentParser reads `--a_b` as `--a-b` (the real run above: `--kv_cache_dtype_
    # skip_layers 0 2` -> ['0', '2'])
    tokens = [t.partition("=")[0].replace("_", "-") + t[len(t.partition("=")[0]):]
              if t.startswith("--") else t for t in tokens]  # fmt: skip
    parsed, extra = parser.parse_known_args(tokens)
    assert extra == [], extra  # vLLM would refuse these ("unrecognized arguments")
    return parsed


def engine_args(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", [])[2:], *container.get("args", [])]


def container(args: list[str]) -> dict[str, Any]:
    return {"name": "engine", "image": "vllm/vllm-openai:v0.32.0",
            "command": ["vllm", "serve"], "args": args}  # fmt: skip


# --- the spec --------------------------------------------------------------------------------


def test_several_entries_are_read_in_order() -> None:
    parsed = RolloutSpec.from_dict(spec(skipLayers=["0", "5", "sliding_window", "35"]))
    assert parsed.kv_cache.skip_layers == ("0", "5", "sliding_window", "35")
    assert parsed.kv_cache.candidate_args() == (FLAG, "0", "5", "sliding_window", "35")


def test_the_bound_is_the_largest_config_kvgate_reads() -> None:
    assert POLICY_MAX_LAYERS == MAX_LAYERS == MAX_SKIP_ENTRIES  # the CRD's maxItems is 4096 too


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (["0", "-1"], "spec.kvCache.skipLayers[1]: '-1' is negative; layer indices count from 0"),
        (
            ["3", "sliding_window", "3"],
            "spec.kvCache.skipLayers[2]: '3' is already skipLayers[0]; give each layer once",
        ),
        (
            ["sliding_window", "sliding_window"],
            "spec.kvCache.skipLayers[1]: 'sliding_window' is already skipLayers[0]",
        ),
        (
            ["07"],
            "spec.kvCache.skipLayers[0]: '07' names no layer: vLLM matches str(layer_index), "
            "so write '7'",
        ),
        (["1", "4096"], "spec.kvCache.skipLayers[1]: '4096' is past any model's layers"),
        (["0,1"], "spec.kvCache.skipLayers[0]: '0,1' is neither a layer index nor sliding_window"),
        (["٣"], "spec.kvCache.skipLayers[0]: '٣' is neither a layer index nor sliding_window"),
        ([""], "spec.kvCache.skipLayers[0]: '' is neither a layer index nor sliding_window"),
        (["²"], "spec.kvCache.skipLayers[0]: '²' is neither a layer index nor sliding_window"),
        # a line break stays escaped: the error is one line
        (["1\nFAKE: ok"], "spec.kvCache.skipLayers[0]: '1\\nFAKE: ok' is neither"),
        # 10,000 digits: past any model, said without converting them (int() would refuse)
        (
            ["9" * 10_000],
            "spec.kvCache.skipLayers[0]: '999999999999999999999999999999999999... is past any "
            "model's layers",
        ),
        (["-" + "9" * 10_000], "spec.kvCache.skipLayers[0]: '-99999999999999999999"),
        (
            ["0", 1],
            "spec.kvCache.skipLayers[1]: 1 is not a string; write a layer index as a string ('3')",
        ),
        ([True], "spec.kvCache.skipLayers[0]: True is not a string"),
        ([None], "spec.kvCache.skipLayers[0]: None is not a string"),
        ([{"layer": 1}], "spec.kvCache.skipLayers[0]: dict is not a string"),
        ("sliding_window", "spec.kvCache.skipLayers: 'sliding_window' is not a list"),
        # 10,000 junk entries: one line, at the first entry past the bound
        ([7] * 10_000, "spec.kvCache.skipLayers[4096]: 10,000 entries: at most 4096"),
        ([str(i) for i in range(10_000)], "spec.kvCache.skipLayers[4096]: 10,000 entries"),
        # many bad entries: the first one is the line
        ([-1] * 4000, "spec.kvCache.skipLayers[0]: -1 is not a string"),
    ],
)
def test_a_hostile_entry_is_one_line_naming_it(entries: Any, expected: str) -> None:
    found = errors(spec(skipLayers=entries))
    assert len(found) == 1 and found[0].startswith(expected), found
    assert "\n" not in found[0] and len(found[0]) < 300


def test_every_layer_of_the_largest_model_passes() -> None:
    entries = [str(i) for i in range(MAX_SKIP_ENTRIES - 1)] + ["sliding_window"]
    assert len(RolloutSpec.from_dict(spec(skipLayers=entries)).kv_cache.skip_layers) == 4096


# --- the candidate's args -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("production", "expected"),
    [
        # no skip list in production: appended as one flag and its values
        (["Qwen/Qwen3-8B", "--max-num-seqs", "64"],
         ["Qwen/Qwen3-8B", "--max-num-seqs", "64", "--kv-cache-dtype", "fp8",
          FLAG, "0", "5", "sliding_window"]),
        # one value in `--flag v` form, then another flag: its value replaced in place
        (["Qwen/Qwen3-8B", FLAG, "sliding_window", "--max-num-seqs", "64"],
         ["Qwen/Qwen3-8B", FLAG, "0", "5", "sliding_window", "--max-num-seqs", "64",
          "--kv-cache-dtype", "fp8"]),
        # `--flag=v`: one token; several values cannot stay in that form (vLLM refuses
        # `--flag=0 5`), so the flag is written with its values after it, in its place
        (["Qwen/Qwen3-8B", "--kv_cache_dtype_skip_layers=sliding_window", "--block-size", "16"],
         ["Qwen/Qwen3-8B", "--kv_cache_dtype_skip_layers", "0", "5", "sliding_window",
          "--block-size", "16", "--kv-cache-dtype", "fp8"]),
        # several old values, last in the list: all of them go
        (["Qwen/Qwen3-8B", FLAG, "1", "2", "3", "4", "9"],
         ["Qwen/Qwen3-8B", FLAG, "0", "5", "sliding_window", "--kv-cache-dtype", "fp8"]),
        # the flag twice (vLLM keeps the last): both carry the new list
        (["Qwen/Qwen3-8B", FLAG, "1", "--max-num-seqs", "8", f"{FLAG}=2"],
         ["Qwen/Qwen3-8B", FLAG, "0", "5", "sliding_window", "--max-num-seqs", "8",
          FLAG, "0", "5", "sliding_window", "--kv-cache-dtype", "fp8"]),
    ],
)  # fmt: skip
def test_the_candidate_carries_the_whole_list(production: list[str], expected: list[str]) -> None:
    parsed = RolloutSpec.from_dict(spec(skipLayers=["0", "5", "sliding_window"]))
    before = container(production)
    candidate = candidate_container(parsed, before)
    assert candidate["args"] == expected
    assert vllm_parse(engine_args(candidate)).kv_cache_dtype_skip_layers == [
        "0", "5", "sliding_window"
    ]  # fmt: skip
    assert before == container(production)  # the input is not modified


def test_one_entry_keeps_the_equals_form() -> None:
    parsed = RolloutSpec.from_dict(spec(skipLayers=["3"]))
    candidate = candidate_container(parsed, container(["M", f"{FLAG}=sliding_window"]))
    assert candidate["args"] == ["M", f"{FLAG}=3", "--kv-cache-dtype", "fp8"]


def test_the_flag_in_command_and_its_values_in_args() -> None:
    parsed = RolloutSpec.from_dict(spec(skipLayers=["0", "1"]))
    before = {"name": "engine", "image": "vllm/vllm-openai:v0.32.0",
              "command": ["vllm", "serve", "M", FLAG], "args": ["7", "8", "--block-size", "16"]}  # fmt: skip
    candidate = candidate_container(parsed, before)
    assert candidate["command"] == ["vllm", "serve", "M", FLAG, "0", "1"]
    assert candidate["args"] == ["--block-size", "16", "--kv-cache-dtype", "fp8"]


def test_a_shell_script_gets_the_list_quoted() -> None:
    parsed = RolloutSpec.from_dict(spec(skipLayers=["0", "sliding_window"]))
    before = {"name": "engine", "image": "vllm/vllm-openai:v0.32.0", "command": ["sh", "-c"],
              "args": [f'exec vllm serve "$MODEL" {FLAG} 4 5 --max-num-seqs 8']}  # fmt: skip
    script = candidate_container(parsed, before)["args"][0]
    assert script == (
        f'exec vllm serve "$MODEL" {FLAG} 0 sliding_window --max-num-seqs 8 --kv-cache-dtype fp8'
    )
    # `=` form, then other shell syntax (nothing can be appended: both flags are there already)
    before["args"] = [
        'vllm serve "$MODEL" --kv_cache_dtype_skip_layers=4 --kv-cache-dtype auto; echo "bye"'
    ]
    script = candidate_container(parsed, before)["args"][0]
    assert script == (
        'vllm serve "$MODEL" --kv_cache_dtype_skip_layers 0 sliding_window --kv-cache-dtype fp8; '
        'echo "bye"'
    )


def test_detection_reads_the_whole_list() -> None:
    flags = engines._flag_values(["M", FLAG, "0", "5", "sliding_window", "--max-num-seqs", "8"])
    assert (flags[FLAG], flags["--max-num-seqs"]) == (["0 5 sliding_window"], ["8"])


# --- promotion and its undo ---------------------------------------------------------------------


def deployment(c: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": [copy.deepcopy(c)]}}}}


@pytest.mark.parametrize(
    "production",
    [
        ["M", "--max-num-seqs", "64"],
        ["M", FLAG, "sliding_window", "--max-num-seqs", "64"],
        ["M", f"{FLAG}=sliding_window", "--max-num-seqs", "64"],
        ["M", FLAG, "0", "1", "2", "3"],
    ],
)
def test_promotion_and_its_revert_restore_the_original_args_exactly(
    production: list[str],
) -> None:
    parsed = RolloutSpec.from_dict(spec(skipLayers=["0", "5", "sliding_window"]))
    previous = container(production)
    candidate = candidate_container(parsed, previous)
    live = deployment(previous)
    # promote: the patch kvgate sends, applied as the apiserver would
    promoted = jsonpatch.apply_patch(live, promotion.patch_ops(0, previous, candidate))
    promoted_c = promoted["spec"]["template"]["spec"]["containers"][0]
    assert promoted_c["args"] == candidate["args"]
    assert promotion.carries(promoted_c, previous, candidate)
    # undo: back to the original args, token for token
    wanted = {**promoted_c, **promotion.revert(promoted_c, previous, candidate)}
    undone = jsonpatch.apply_patch(promoted, promotion.patch_ops(0, promoted_c, wanted))
    undone_c = undone["spec"]["template"]["spec"]["containers"][0]
    assert undone_c == previous
    assert promotion.reverted(undone_c, previous, candidate)


def test_the_revert_keeps_someone_elses_edit_and_takes_all_of_ours() -> None:
    parsed = RolloutSpec.from_dict(spec(skipLayers=["0", "5", "sliding_window"]))
    previous = container(["M", FLAG, "sliding_window", "--max-num-seqs", "64"])
    candidate = candidate_container(parsed, previous)
    live = copy.deepcopy(candidate)
    live["args"] = [*live["args"], "--block-size", "32"]  # another edit after the promotion
    assert promotion.carries(live, previous, candidate)
    out = promotion.revert(live, previous, candidate)
    assert out["args"] == ["M", FLAG, "sliding_window", "--max-num-seqs", "64",
                           "--block-size", "32"]  # fmt: skip


def test_a_half_reverted_list_is_not_carried() -> None:
    """Someone removed one of our values by hand: kvgate's change is not all there."""
    parsed = RolloutSpec.from_dict(spec(skipLayers=["0", "5", "sliding_window"]))
    previous = container(["M"])
    candidate = candidate_container(parsed, previous)
    live = copy.deepcopy(candidate)
    live["args"].remove("5")
    assert not promotion.carries(live, previous, candidate)


# --- capacity ------------------------------------------------------------------------------------


def qwen3(layers: int = 4, **extra: Any) -> Any:
    return parse_kv_layout({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": layers,
        "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "torch_dtype": "bfloat16", **extra,
    })  # fmt: skip


def test_capacity_counts_every_skipped_layer() -> None:
    """512 bytes a token a 16-bit layer, 256 an FP8 one (tests/data/real-engine/kv-formats:
    the real engine's pool for skip 0,1,2 is 4,608 tokens, 1,792 bytes a token)."""
    layout = qwen3()
    assert layout.bytes_per_token("fp8", skip_layers=["0", "1", "2"]) == 3 * 512 + 256
    assert expected_capacity_gain(layout, "auto", "fp8", skip_layers=["0", "1", "2"]) == (
        2048 / 1792
    )


def test_an_index_past_the_models_layers_is_named_at_preflight() -> None:
    layout = qwen3(layers=4)
    assert _skip_layers_problem(layout, "fp8", ["0", "sliding_window", "4"]) == (
        "spec.kvCache.skipLayers[2]: '4' is neither a layer index below 4 nor 'sliding_window' "
        "(Qwen3ForCausalLM: num_hidden_layers 4)"
    )
    assert _skip_layers_problem(layout, "fp8", ["0", "3"]) is None
