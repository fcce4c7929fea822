"""The page sizes kvgate.engines.kvformats uses are what the installed real vLLM's own code computes
today (hack/real_kv_formats.py --pages: no server, the engine's `customize_spec` and layout
helpers), and the committed record of them (tests/data/real-engine/kv-formats/
pages-vllm-0.32.0.json, which the fast tier tests) is that output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.engines import kvformats
from real_kv_formats import pages

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(900)]

COMMITTED = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "real-engine"
    / "kv-formats"
    / "pages-vllm-0.32.0.json"
)


def test_vllms_own_pages_match_the_record_and_kvformats(vllm_installed: None) -> None:
    live = pages()
    assert live == json.loads(COMMITTED.read_text())
    for name, sizes in live["bytes_per_head"].items():
        fmt = kvformats.lookup("vllm", name)
        assert {d: fmt.bytes_per_head(int(d)) for d in sizes} == sizes, name
