"""The simulator's dcgm-exporter: KVGATE_SIM_DCGM, the exposition, and the server."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvgate.sim import dcgm
from kvgate.sim.config import GPUS, DcgmSpec, SimConfigError, parse_dcgm, read_env

WHO = dcgm.PodIdentity(pod="r-fp8-candidate", namespace="team-a", container="engine")


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_defaults_are_the_gpus_clocks_on_port_9400() -> None:
    assert parse_dcgm("", GPUS["L4"]) == DcgmSpec(port=9400, sm_mhz=2040.0, mem_mhz=6251.0)
    assert parse_dcgm("", GPUS["H100"]).sm_mhz == 1980.0
    assert parse_dcgm("off", GPUS["L4"]).port is None
    assert read_env("vllm", {"KVGATE_SIM_GPU": "A100"}).dcgm.mem_mhz == 1593.0


def test_overrides_and_the_fp8_arm() -> None:
    spec = parse_dcgm("port=9500, sm-clock=1900, fp8-sm-clock=1410", GPUS["L4"])
    assert (spec.port, spec.sm_mhz, spec.mem_mhz, spec.fp8_sm_mhz) == (9500, 1900, 6251, 1410)
    assert dcgm.clocks_for(spec, "auto") == (1900.0, 6251.0)
    assert dcgm.clocks_for(spec, "fp8_e4m3") == (1410.0, 6251.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("sm=2040", "KVGATE_SIM_DCGM: unknown key 'sm' (known: port, sm-clock, mem-clock, "),
        ("sm-clock=fast", "KVGATE_SIM_DCGM: sm-clock='fast' is not a number"),
        ("sm-clock=0", "KVGATE_SIM_DCGM: sm-clock=0 is outside [1, 10000]"),
        ("sm-clock=nan", "KVGATE_SIM_DCGM: sm-clock=nan is outside [1, 10000]"),
        ("port=70000", "KVGATE_SIM_DCGM: port=70000 is outside [1, 65535]"),
        ("port=94.5", "KVGATE_SIM_DCGM: port=94.5 is not a whole number"),
        ("sm-clock", "KVGATE_SIM_DCGM: 'sm-clock' is not key=value"),
    ],
)
def test_bad_values_name_the_variable_and_key(raw: str, message: str) -> None:
    with pytest.raises(SimConfigError) as caught:
        parse_dcgm(raw, GPUS["L4"])
    assert str(caught.value).startswith(message)


@given(st.text(max_size=80))
def test_any_text_is_a_spec_or_one_clear_error(raw: str) -> None:
    try:
        spec = parse_dcgm(raw, GPUS["L4"])
    except SimConfigError as exc:
        assert str(exc).startswith("KVGATE_SIM_DCGM: ")
    else:
        assert spec.port is None or 1 <= spec.port <= 65535
        assert 1 <= spec.sm_mhz <= 10000


def test_exposition_has_dcgm_names_help_and_pod_labels() -> None:
    collector = dcgm.DcgmCollector(GPUS["L4"], 1410.0, 6251.0, WHO)
    text = dcgm.generate(collector)
    found = families(text)
    sm, mem = found["DCGM_FI_DEV_SM_CLOCK"], found["DCGM_FI_DEV_MEM_CLOCK"]
    assert (sm.type, sm.documentation) == ("gauge", "SM clock frequency (in MHz).")
    assert (mem.type, mem.documentation) == ("gauge", "Memory clock frequency (in MHz).")
    (sample,) = sm.samples
    assert sample.value == 1410.0
    labels = sample.labels
    assert (labels["pod"], labels["namespace"], labels["container"]) == (
        "r-fp8-candidate",
        "team-a",
        "engine",
    )
    assert labels["modelName"] == "NVIDIA L4" and labels["gpu"] == "0"
    assert labels["UUID"].startswith("GPU-") and len(labels["UUID"]) == 40
    assert mem.samples[0].value == 6251.0


def test_identity_comes_from_the_pod_hostname_and_namespace(tmp_path: Any, monkeypatch) -> None:
    sa = tmp_path / "namespace"
    sa.write_text("team-b\n")
    monkeypatch.setattr(dcgm, "SA_NAMESPACE", sa)
    who = dcgm.PodIdentity.of_this_process({"HOSTNAME": "web-0"})
    assert (who.pod, who.namespace) == ("web-0", "team-b")
    assert (
        dcgm.PodIdentity.of_this_process({"HOSTNAME": "w", "POD_NAMESPACE": "x"}).namespace == "x"
    )
    monkeypatch.setattr(dcgm, "SA_NAMESPACE", tmp_path / "missing")
    assert dcgm.PodIdentity.of_this_process({"HOSTNAME": "w"}).namespace == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_served_on_its_port_and_a_taken_port_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = _free_port()
    collector = dcgm.DcgmCollector(GPUS["L4"], 2040.0, 6251.0, WHO)
    started = dcgm.serve(collector, "127.0.0.1", port)
    assert started is not None
    server, _thread = started
    try:
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert families(body)["DCGM_FI_DEV_SM_CLOCK"].samples[0].value == 2040.0
        # A second exporter on the same address does not start, and says so once.
        assert dcgm.serve(collector, "127.0.0.1", port) is None
        err = capsys.readouterr().err
        assert err.startswith(f"kvgate.sim: dcgm-exporter on 127.0.0.1:{port} not started: ")
        assert err.count("\n") == 1
    finally:
        server.shutdown()
        server.server_close()


def test_a_gpu_below_its_clocks_is_slower_in_the_engine_model() -> None:
    l4 = GPUS["L4"]
    assert dcgm.clocked(l4, l4.sm_clock_mhz, l4.mem_clock_mhz) == l4  # at its clocks: itself
    slow = dcgm.clocked(l4, 1020.0, 3125.5)  # half of each
    assert slow.bf16_tflops == pytest.approx(l4.bf16_tflops / 2)
    assert slow.bandwidth_gbs == pytest.approx(l4.bandwidth_gbs / 2)
