"""A dcgm-exporter beside the simulated engine: the GPU clocks a node's exporter would report.

On a GPU node NVIDIA's dcgm-exporter (a DaemonSet, port 9400) serves one series per GPU and
field, labelled in its Kubernetes mode with the pod that holds the GPU. The simulator serves
the same two clock fields for its own emulated GPU, so that Prometheus can scrape them and
kvgate can check that both arms ran at the same clocks before it compares their speed.

Names, types and help texts are dcgm-exporter's `etc/default-counters.csv`:

    DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
    DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).

and the labels those of its README's Kubernetes example (gpu, UUID, container, namespace, pod)
plus the device labels of current releases (pci_bus_id, device, modelName, Hostname).
`KVGATE_SIM_DCGM` sets the port and the clocks (`kvgate.sim.config.DcgmSpec`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.sim.config import DcgmSpec, GpuProfile

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class PodIdentity:
    """What dcgm-exporter's pod mapping attaches: the pod, namespace and container of a GPU."""

    pod: str
    namespace: str
    container: str

    @classmethod
    def of_this_process(cls, environ: dict[str, str], container: str = "engine") -> PodIdentity:
        # A pod's hostname is its name; its namespace is in the ServiceAccount mount.
        pod = environ.get("HOSTNAME") or socket.gethostname()
        namespace = environ.get("POD_NAMESPACE", "")
        if not namespace:
            try:
                namespace = SA_NAMESPACE.read_text(encoding="utf-8").strip()[:253]
            except OSError:
                namespace = ""
        return cls(pod=pod, namespace=namespace, container=container)


class DcgmCollector(Collector):
    """The SM and memory clocks of one emulated GPU, as dcgm-exporter renders them."""

    def __init__(self, gpu: GpuProfile, sm_mhz: float, mem_mhz: float, who: PodIdentity) -> None:
        self.sm_mhz, self.mem_mhz = sm_mhz, mem_mhz
        digest = hashlib.sha256(f"{who.namespace}/{who.pod}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        self.labels = {
            "gpu": "0",
            "UUID": uuid,
            "pci_bus_id": "00000000:00:1E.0",
            "device": "nvidia0",
            "modelName": gpu.device_name,
            "Hostname": who.pod,
            "container": who.container,
            "namespace": who.namespace,
            "pod": who.pod,
        }

    def collect(self) -> Iterator[Metric]:
        for name, doc, value in (
            ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", self.sm_mhz),
            ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", self.mem_mhz),
        ):
            family = GaugeMetricFamily(name, doc, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), value)
            yield family


def clocks_for(spec: DcgmSpec, kv_cache_dtype: str) -> tuple[float, float]:
    """(SM, memory) MHz of this engine: the FP8 overrides apply to an FP8 KV cache."""
    fp8 = kv_cache_dtype.startswith("fp8")
    sm = spec.fp8_sm_mhz if fp8 and spec.fp8_sm_mhz is not None else spec.sm_mhz
    mem = spec.fp8_mem_mhz if fp8 and spec.fp8_mem_mhz is not None else spec.mem_mhz
    return sm, mem


def clocked(gpu: GpuProfile, sm_mhz: float, mem_mhz: float) -> GpuProfile:
    """The GPU at these clocks: compute scales with the SM clock, bandwidth with memory's.

    So a GPU held below its clocks is slower in the engine model too (prefill by SM clock,
    decode, which reads weights and KV at memory bandwidth, by memory clock).
    """
    return dataclasses.replace(
        gpu,
        bf16_tflops=gpu.bf16_tflops * sm_mhz / gpu.sm_clock_mhz,
        bandwidth_gbs=gpu.bandwidth_gbs * mem_mhz / gpu.mem_clock_mhz,
    )


def registry_for(collector: DcgmCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def generate(collector: DcgmCollector) -> str:
    """The exposition text, as a scrape of the exporter returns it."""
    return generate_latest(registry_for(collector)).decode()


def serve(
    collector: DcgmCollector, host: str, port: int
) -> tuple[WSGIServer, threading.Thread] | None:
    """Serve /metrics on host:port in a thread; None (and a line on stderr) if it is taken."""
    try:
        return start_http_server(port, addr=host, registry=registry_for(collector))
    except OSError as exc:
        print(f"kvgate.sim: dcgm-exporter on {host}:{port} not started: {exc}", file=sys.stderr)
        return None


__all__ = [
    "DcgmCollector",
    "PodIdentity",
    "clocked",
    "clocks_for",
    "generate",
    "registry_for",
    "serve",
]
