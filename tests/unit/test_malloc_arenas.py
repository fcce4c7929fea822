"""`kvgate run` caps glibc's malloc arenas before its threads start: many handler threads that
allocate at once then share two arenas instead of one each (the operator's peak memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Eight threads allocate at once, then glibc's malloc_info says how many arenas (heaps) exist.
_PROBE = textwrap.dedent(
    """
    import ctypes, os, sys, tempfile, threading
    from kvgate.commands.run import cap_malloc_arenas
    capped = cap_malloc_arenas() if sys.argv[1] == "cap" else False
    gate = threading.Barrier(8)
    def work():
        gate.wait()
        keep = [bytearray(4096) for _ in range(2000)]
        gate.wait()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    with tempfile.TemporaryFile() as out:
        fp = libc.fdopen(os.dup(out.fileno()), b"w")
        libc.malloc_info(0, ctypes.c_void_p(fp))
        libc.fclose(ctypes.c_void_p(fp))
        out.seek(0)
        heaps = out.read().count(b"<heap nr=")
    print(capped, heaps)
    """
)


def _heaps(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env["PYTHONPATH"] = str(ROOT / "operator")
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()  # fmt: skip
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_info")
def test_threads_that_allocate_at_once_share_two_arenas() -> None:
    # GIVEN eight threads allocating at the same moment, WHEN the arenas are not capped,
    # THEN glibc gives them more than two (the probe can tell the difference at all)
    assert _heaps("free")[1] > 2
    # WHEN kvgate run's cap is set first, THEN they share two
    capped, heaps = _heaps("cap")
    assert capped == "True" and heaps <= 2
