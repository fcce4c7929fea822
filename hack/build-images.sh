#!/usr/bin/env bash
# Build the Dockerfile's `operator`, `eval` and `load` images with buildah, without a registry.
#
#   hack/build-images.sh            # kvgate, kvgate-eval and kvgate-load:<version> in buildah's store
#   KVGATE_IMAGES="operator eval"   # only those targets (the load image is the largest, ~0.9 GB)
#   KVGATE_IMAGE_ARCHIVE_DIR=dir    # also write each image as an OCI archive into dir
#
# Public base images cannot be pulled here, so the bases (Debian 12 with Python 3.11 and passwd, what the
# Dockerfile's PYTHON_IMAGE names; Debian 13 with Python 3.13 for LOAD_PYTHON_IMAGE) are made by
# mmdebstrap from Debian's packages. Where a registry is reachable, PYTHON_IMAGE=python:3.11.14-slim-bookworm
# and LOAD_PYTHON_IMAGE=python:3.12.12-slim-bookworm use the Dockerfile's own defaults.
# The Dockerfile is used unchanged. Package traffic may pass a TLS proxy whose CA is in the
# host's bundle: the bundle is mounted read-only into the build's RUN steps (never copied into a
# layer), with a pip.conf that names it.
#
# Each image is tagged with a content hash of its build inputs (Dockerfile, .dockerignore, trim-venv.sh, pyproject, README,
# operator/ sources, base); a warm run finds the tag and builds nothing.
#
# Offline clusters (this machine) have no Hugging Face Hub: with a GSM8K directory
# (KVGATE_GSM8K_DIR, default ../shared/data/gsm8k when it exists; KVGATE_GSM8K_DIR= to skip)
# one more layer bakes test.jsonl and train.jsonl into /data/gsm8k with
# KVGATE_GSM8K_DIR=/data/gsm8k, for the simulator, the eval Job and the load Job's tokenizer. Each final image is tagged
# localhost/<name>:<version> and with the chart's default name, ghcr.io/kvgate/<name>:<version>.
set -euo pipefail
cd "$(dirname "$0")/.."

# Which of the Dockerfile's targets to build: all three unless KVGATE_IMAGES names some.
TARGETS=${KVGATE_IMAGES:-operator eval load}
for target in $TARGETS; do
  case $target in operator|eval|load) ;; *) echo "build-images: KVGATE_IMAGES: no target '$target' (operator, eval, load)" >&2; exit 2;; esac
done

need() { command -v "$1" >/dev/null || { echo "build-images: $1 not found (apt-get install $2)" >&2; exit 2; }; }
need buildah buildah
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
CACHE=${KVGATE_CACHE_DIR:-$HOME/.cache/kvgate}/images
mkdir -p "$CACHE"
BUILDAH=(buildah ${KVGATE_STORAGE_DRIVER:+--storage-driver "$KVGATE_STORAGE_DRIVER"})

has_image() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# ---- the base images ----
# Debian's python3 made into an image by mmdebstrap: bookworm (3.11) for the operator and eval
# images, trixie (3.13) for the load image (inference-perf 0.7.0 requires Python 3.12+).
BASE_PACKAGES="python3,python3-venv,ca-certificates,passwd"
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
debian_base() {  # debian_base SUITE PURGE: prints the base image's name, building it if needed
  local suite=$1 purge=$2 hash image started tarball ctr
  hash=$(printf '%s minbase %s %s python-link purge %s\n' "$suite" "$BASE_PACKAGES" "$BASE_PATH" "$purge" | sha256sum | cut -c1-12)
  image=localhost/kvgate-base:$suite-$hash
  if ! has_image "$image"; then
    need mmdebstrap mmdebstrap
    started=$(date +%s)
    tarball="$CACHE/base-$suite-$hash.tar"
    # The host's sources (Debian's own mirror, through whatever proxy apt uses) serve the build.
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook="chroot \"\$1\" dpkg --purge --force-remove-essential --force-depends $purge >/dev/null" \
      --customize-hook='rm -rf "$1"/var/cache/apt "$1"/var/lib/apt/lists' \
      "$suite" "$tarball" >&2
    ctr=$("${BUILDAH[@]}" from scratch)
    "${BUILDAH[@]}" add "$ctr" "$tarball" / >/dev/null
    # The Dockerfile runs `python`; Debian's interpreter is python3.
    "${BUILDAH[@]}" run --isolation chroot "$ctr" -- ln -sf /usr/bin/python3 /usr/local/bin/python
    "${BUILDAH[@]}" config --env PATH=$BASE_PATH --cmd python3 "$ctr"
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$image" >/dev/null
    rm -f "$tarball"
    echo "build-images: base $image in $(( $(date +%s) - started ))s" >&2
  fi
  echo "$image"
}

if [ -n "${PYTHON_IMAGE:-}" ]; then
  BASE=$PYTHON_IMAGE
else
  # usrmerge (which pulls in 47 MB of perl) did its work at install; apt is not run in an image.
  BASE=$(debian_base bookworm "usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl perl-modules-5.36 libperl5.36 apt libapt-pkg6.0")
fi
LOAD_BASE=""
if [[ " $TARGETS " == *" load "* ]]; then
  if [ -n "${LOAD_PYTHON_IMAGE:-}" ]; then
    LOAD_BASE=$LOAD_PYTHON_IMAGE
  else
    LOAD_BASE=$(debian_base trixie "apt libapt-pkg7.0")
  fi
fi

# ---- the targets ----
inputs_hash() {  # inputs_hash TARGET BASE
  { printf '%s\n' "$2" "$1"; cat Dockerfile .dockerignore hack/trim-venv.sh pyproject.toml README.md
    git ls-files -z operator | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-12
}

build_args=(--isolation chroot --layers --build-arg "PYTHON_IMAGE=$BASE")
[ -n "$LOAD_BASE" ] && build_args+=(--build-arg "LOAD_PYTHON_IMAGE=$LOAD_BASE")
ca=${KVGATE_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
if [ -r "$ca" ]; then
  pipconf="$CACHE/pip.conf"
  printf '[global]\ncert = /run/kvgate-build/ca.crt\n' > "$pipconf"
  build_args+=(--volume "$ca:/run/kvgate-build/ca.crt:ro" --volume "$pipconf:/etc/pip.conf:ro")
fi

GSM8K=${KVGATE_GSM8K_DIR-../shared/data/gsm8k}
if [ -n "$GSM8K" ] && ! [ -r "$GSM8K/test.jsonl" ] && [ -n "${KVGATE_GSM8K_DIR:-}" ]; then
  echo "build-images: KVGATE_GSM8K_DIR=$GSM8K has no test.jsonl" >&2; exit 2
fi
[ -r "$GSM8K/test.jsonl" ] && [ -r "$GSM8K/train.jsonl" ] || GSM8K=""
if [ -z "$GSM8K" ]; then  # said, not silent: the chart's default config.gsm8kDir is /data/gsm8k
  echo "build-images: no GSM8K (KVGATE_GSM8K_DIR): the eval image has no /data/gsm8k; install the chart with --set config.gsm8kDir= (the eval Job then downloads openai/gsm8k from the hub) or rebuild with KVGATE_GSM8K_DIR set" >&2
fi

for target in $TARGETS; do
  name=kvgate; [ "$target" != operator ] && name=kvgate-$target
  base=$BASE; [ "$target" = load ] && base=$LOAD_BASE
  tag="localhost/$name:$VERSION-$(inputs_hash "$target" "$base")"
  if has_image "$tag"; then
    echo "build-images: $tag is up to date"
  else
    started=$(date +%s)
    "${BUILDAH[@]}" bud --quiet "${build_args[@]}" --target "$target" -t "$tag" . >/dev/null
    echo "build-images: $tag built in $(( $(date +%s) - started ))s"
  fi
  final=$tag
  if [ -n "$GSM8K" ]; then
    final="$tag-gsm8k-$(cat "$GSM8K/test.jsonl" "$GSM8K/train.jsonl" | sha256sum | cut -c1-8)"
    if ! has_image "$final"; then
      ctr=$("${BUILDAH[@]}" from --pull-never "$tag")
      "${BUILDAH[@]}" copy --quiet --chown 0:0 --chmod 0644 "$ctr" "$GSM8K/test.jsonl" "$GSM8K/train.jsonl" /data/gsm8k/ >/dev/null
      [ -r "$GSM8K/LICENSE" ] && "${BUILDAH[@]}" copy --quiet --chown 0:0 --chmod 0644 "$ctr" "$GSM8K/LICENSE" /data/gsm8k/ >/dev/null
      "${BUILDAH[@]}" config --env KVGATE_GSM8K_DIR=/data/gsm8k "$ctr"
      "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$final" >/dev/null
    fi
  fi
  "${BUILDAH[@]}" tag "$final" "localhost/$name:$VERSION" "ghcr.io/kvgate/$name:$VERSION"
  size=$("${BUILDAH[@]}" images --noheading --format '{{.Size}}' "$final" 2>/dev/null | sed -n 1p)
  echo "build-images: localhost/$name:$VERSION -> $final${size:+ ($size)}"
  if [ -n "${KVGATE_IMAGE_ARCHIVE_DIR:-}" ]; then
    # An archive written from the same tag is reused (its .tag file names the tag).
    archive="$KVGATE_IMAGE_ARCHIVE_DIR/$name.tar"
    mkdir -p "$KVGATE_IMAGE_ARCHIVE_DIR"
    if [ "$(cat "$archive.tag" 2>/dev/null)" != "$final" ] || [ ! -s "$archive" ]; then
      rm -f "$archive.tag"
      "${BUILDAH[@]}" push --quiet "$final" "oci-archive:$archive:ghcr.io/kvgate/$name:$VERSION"
      echo "$final" >"$archive.tag"
    fi
  fi
done
