#!/usr/bin/env bash
# Installs the Debian packages that `make test` and `make demo` need, when they are missing:
# buildah and mmdebstrap build the images; runc, the CNI plugins, iptables and iproute2 make
# the real node; openssl makes the local cluster's certificates. Needs root and apt-get;
# otherwise it names what is missing and exits 1.
set -euo pipefail
PACKAGES=(buildah mmdebstrap uidmap runc containernetworking-plugins iptables iproute2 openssl)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-deps: missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "install-deps: apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || true
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
