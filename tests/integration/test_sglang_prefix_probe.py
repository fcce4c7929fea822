"""The load gate's prefix-cache probe on SGLang arms (issue 39, item 3), against kvgate.sim as
SGLang 0.5.23: its /metrics carry `sglang:prompt_tokens_total` and, once the radix cache hits,
`sglang:cached_tokens_total{cache_source="device"}` (0.5.23 sglang/srt/observability/
metrics_collector.py:1855, :1934, :2109-2134), and /server_info its `disable_radix_cache`
(server_args.resolved_dict(), sglang/srt/utils/common.py:3589). A candidate whose radix cache
is off where the control's is on cannot be called faster (kvgate.judge.outputcheck)."""

from __future__ import annotations

import httpx
import pytest

from kvgate.commands.load_job import _prefix_probe
from kvgate.judge.outputcheck import prefix_problem
from kvgate.records.loadresult import SGLANG_SWITCH

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "Qwen/Qwen3-8B"
LAUNCH = ["sglang", "--model-path", MODEL, "--enable-metrics"]
VERSION = {"KVGATE_SIM_ENGINE_VERSION": "0.5.23"}


def test_an_sglang_arm_with_its_radix_cache_hits_the_repeated_prompt(sim) -> None:
    engine = sim(
        [*LAUNCH, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "triton"], VERSION
    )
    probe = _prefix_probe(engine.url, MODEL)
    assert probe.error is None
    assert (probe.enabled, probe.switch) == (True, SGLANG_SWITCH)
    assert probe.queries is not None and probe.queries > 0
    # the second of the two identical prompts is served from the radix cache
    assert probe.hits is not None and 0.4 <= probe.hits / probe.queries <= 0.5


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--disable-radix-cache"], {}),  # the flag itself
        ([], {"KVGATE_SIM_FAULTS": "no-prefix-caching"}),  # FP8 KV that turned it off
    ],
)
def test_an_sglang_candidate_without_its_radix_cache_is_refused(
    sim, args: list[str], env: dict[str, str]
) -> None:
    control = sim([*LAUNCH], VERSION)
    candidate = sim(
        [*LAUNCH, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "triton", *args],
        {**VERSION, **env},
    )
    theirs = _prefix_probe(control.url, MODEL)
    mine = _prefix_probe(candidate.url, MODEL)
    # no cached-token series on the candidate (SGLang adds it at the first hit): read as 0
    assert (mine.enabled, mine.hits) == (False, 0.0)
    assert mine.queries is not None and mine.queries > 0
    assert "sglang:cached_tokens_total" not in httpx.get(candidate.url + "/metrics").text
    assert prefix_problem(theirs, mine) == (
        "server_info says disable_radix_cache true on the candidate, false on the control"
    )
    # without the switch, the hit rate alone still refuses it
    blind = type(mine)(queries=mine.queries, hits=mine.hits)
    assert "prefix caching is off on the candidate" in (prefix_problem(theirs, blind) or "")
