"""hack/vllmenv.sh's promises under a failing install: a half-made venv never counts as made
(no stamp, no .venv-vllm link) and is removed before the next try; a made one is reused.

The script runs from a copy in a scratch tree (so the link it makes is the copy's), with a
stand-in Python whose venvs' pip fails or succeeds as the test says: no network, no vLLM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

HACK = Path(__file__).resolve().parents[2] / "hack"

# A stand-in interpreter: `-c` prints a version, `-m venv DEST` makes DEST/bin/{pip,python},
# where pip exits with $FAKE_PIP_RC and python (the import check) succeeds.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-c" ]; then echo 3.12.1; exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/sh\\ntouch "$(dirname "$0")/../pip-ran"\\nexit %s\\n' "$FAKE_PIP_RC" > "$3/bin/pip"
  printf '#!/bin/sh\\ncat >/dev/null\\necho ok\\n' > "$3/bin/python"
  chmod +x "$3/bin/pip" "$3/bin/python"
  exit 0
fi
exit 2
"""


def run(tree: Path, pip_rc: int) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KVGATE_CACHE_DIR": str(tree / "cache"),
        "VLLM_PYTHON": str(tree / "python3"),
        "FAKE_PIP_RC": str(pip_rc),
    }
    return subprocess.run(
        ["bash", str(tree / "hack" / "vllmenv.sh")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_failed_install_is_never_taken_for_a_made_one(tmp_path: Path) -> None:
    (tmp_path / "hack" / "vllm").mkdir(parents=True)
    shutil.copy(HACK / "vllmenv.sh", tmp_path / "hack" / "vllmenv.sh")
    shutil.copy(HACK / "vllm" / "requirements.txt", tmp_path / "hack" / "vllm")
    (tmp_path / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "python3").chmod(0o755)

    failed = run(tmp_path, pip_rc=1)
    assert failed.returncode != 0
    (dest,) = (tmp_path / "cache" / "vllm").glob("*-py3.12.1")
    assert (dest / "pip-ran").exists() and not (dest / ".installed").exists()
    assert not (tmp_path / ".venv-vllm").exists()  # nothing points at the half-made venv
    (dest / "left-by-the-failed-try").touch()

    made = run(tmp_path, pip_rc=0)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(dest)
    assert (dest / ".installed").exists()
    assert not (dest / "left-by-the-failed-try").exists()  # removed before the new try
    assert (tmp_path / ".venv-vllm").resolve() == dest.resolve()

    (dest / "pip-ran").unlink()
    again = run(tmp_path, pip_rc=1)  # a made venv is reused: pip is not run again
    assert again.returncode == 0 and not (dest / "pip-ran").exists()
