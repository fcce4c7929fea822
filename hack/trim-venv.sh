#!/bin/sh
# Run by the Dockerfile's build stages on the image venv: removes what nothing in kvgate imports
# or needs at run time. Each line says what it saves (measured on the operator image).
set -eu
venv=${1:?usage: trim-venv.sh VENV}
pip="/opt/pip/bin/pip --python $venv/bin/python"
# hf-xet (11 MB): huggingface_hub reads over plain HTTPS without it.
$pip uninstall --yes --quiet hf-xet
# Test suites (26 MB) and the kubernetes client's asyncio copy (42 MB; kopf uses aiohttp).
find "$venv" -depth -type d -path '*/site-packages/*' \
  \( -name tests -o -path '*/site-packages/kubernetes/aio' \) -exec rm -rf {} +
# Build-time files of compiled packages: type stubs, Cython and C sources, headers (5 MB).
find "$venv" -type f -path '*/site-packages/*' \
  \( -name '*.pyi' -o -name '*.pxd' -o -name '*.pyx' -o -name '*.h' -o -name '*.c' -o -name '*.a' \) \
  -delete
