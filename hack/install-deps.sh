#!/usr/bin/env bash
# Installs the Debian packages that `make test` and `make demo` need, when they are missing:
# buildah and mmdebstrap build the images; runc, the CNI plugins, iptables, ipset and iproute2 make
# the real node; openssl makes the local cluster's certificates; prometheus (and promtool)
# serve the metrics tests. With --tools (what `make test` asks for), also chromium: the tools
# tier renders the HTML reports in headless Chromium (tests/integration/test_report_browser.py).
# Needs root and apt-get; otherwise it names what is missing and exits 1. No service is started:
# tests start their own servers on loopback.
set -euo pipefail
PACKAGES=(buildah mmdebstrap uidmap runc containernetworking-plugins iptables ipset iproute2 openssl prometheus)
TOOLS_PACKAGES=(chromium)
case "${1:-}" in
  --tools) PACKAGES+=("${TOOLS_PACKAGES[@]}") ;;
  "") ;;
  *) echo "install-deps: unknown argument ${1} (only --tools)" >&2; exit 2 ;;
esac
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
# Packages must not start their daemons (prometheus would listen on :9090): policy-rc.d says no.
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
fi
trap '[ -n "$own_policy" ] && rm -f "$policy"' EXIT
apt-get update -qq >/dev/null || true
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
