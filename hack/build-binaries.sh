#!/usr/bin/env bash
# Builds the local control plane's binaries from Go modules (no Docker, no
# release tarballs): kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, etcd and helm, into a per-version cache outside the checkout.
#
#   hack/build-binaries.sh            build what is missing, print the bin dir
#   hack/build-binaries.sh --node     also the real node: kubelet, kube-proxy, containerd,
#                                     and its NetworkPolicy engine, kube-router
#   hack/build-binaries.sh --forge    only the test forge: Gitea (opt-in; cgo, for sqlite)
#   hack/build-binaries.sh --gitops   only the GitOps tools' own code: argocd-health (Argo CD's
#                                     Lua health evaluator, hack/go/argocd-health/)
#   hack/build-binaries.sh --flux     only Flux: source-controller, kustomize-controller and
#                                     their CRDs (flux-crds/)
#   hack/build-binaries.sh --print    print the bin dir only
#   hack/build-binaries.sh --update   regenerate hack/go/*/go.mod+go.sum for the
#                                     versions below (needs the module proxy)
#
# The wrapper modules in hack/go/ pin every module checksum (go.sum), so a
# build on a fresh machine fetches exactly what was tested. Kubernetes'
# own go.mod requires its staging modules at v0.0.0 with `replace => ./staging`,
# which `go install pkg@version` refuses; the wrapper replaces each staging
# module with its published v0.<minor>.<patch> tag instead.
set -euo pipefail

KUBE_VERSION="v1.37.2"
ETCD_VERSION="v3.6.16"
HELM_VERSION="v3.22.0"
CONTAINERD_VERSION="v2.3.7"
GITEA_VERSION="v1.26.0"
# Argo CD's health evaluator (util/lua + util/settings + gitops-engine's health package). v3.2.12
# is the newest release the module proxy serves whole to Go 1.26: v3.3.0 to v3.5.8 replace
# github.com/argoproj/argo-cd/gitops-engine with ./gitops-engine, a nested module no module zip
# carries (its pinned pseudo-version answers 403), and v3.6.x declares `go 1.27.0`.
ARGOCD_VERSION="v3.2.12"
# Flux's source-controller and kustomize-controller (one Flux release). v1.10.x declares
# `go 1.27.0`; v1.9.6's source-controller requires github.com/fluxcd/pkg/artifact v0.18.3, which
# the module proxy refuses (403, v0.18.2 too): hack/go/flux-source/ replaces it with v0.18.1.
FLUX_SOURCE_VERSION="v1.9.6"
FLUX_KUSTOMIZE_VERSION="v1.9.6"
# The real node's NetworkPolicy engine (its firewall only: iptables + ipset). Not the SIG Network
# reference engine kube-network-policies: that one needs nftables' `queue` expression, which
# this kernel lacks (hack/containerd_node.py says how that was found).
KUBE_ROUTER_VERSION="v2.1.0"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${KVGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate}"
OUT="$CACHE_ROOT/bin/$KUBE_VERSION"
export CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOFLAGS="-mod=readonly -buildvcs=false"

log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- --update: regenerate the wrapper modules (developer use) ----------------
update_wrappers() {
	local gomod mods staging="v0.${KUBE_VERSION#v1.}"
	gomod="$(cd / && GOFLAGS= go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
	# Replace exactly the modules upstream points at ./staging: the others
	# (klog, utils, kube-openapi) carry real versions and must stay as they are.
	mods="$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$gomod")"
	[ "$(wc -l <<<"$mods")" -ge 30 ] || { log "staging module list from $gomod looks wrong"; exit 1; }
	mkdir -p "$HERE/go/k8s" "$HERE/go/etcd" "$HERE/go/helm" "$HERE/go/containerd" "$HERE/go/kube-router"
	cat >"$HERE/go/k8s/go.mod" <<-EOF
		module kvgate.local/hack/k8s

		go 1.26.0

		godebug default=go1.26

		require k8s.io/kubernetes $KUBE_VERSION

		tool (
		${TAB}k8s.io/kubernetes/cmd/kube-apiserver
		${TAB}k8s.io/kubernetes/cmd/kube-controller-manager
		${TAB}k8s.io/kubernetes/cmd/kube-proxy
		${TAB}k8s.io/kubernetes/cmd/kube-scheduler
		${TAB}k8s.io/kubernetes/cmd/kubectl
		${TAB}k8s.io/kubernetes/cmd/kubelet
		)
	EOF
	for m in $mods; do (cd "$HERE/go/k8s" && go mod edit -replace="$m=$m@$staging"); done
	cat >"$HERE/go/etcd/go.mod" <<-EOF
		module kvgate.local/hack/etcd

		go 1.26.0

		require go.etcd.io/etcd/server/v3 $ETCD_VERSION

		tool go.etcd.io/etcd/server/v3
	EOF
	cat >"$HERE/go/helm/go.mod" <<-EOF
		module kvgate.local/hack/helm

		go 1.26.0

		require helm.sh/helm/v3 $HELM_VERSION

		tool helm.sh/helm/v3/cmd/helm
	EOF
	cat >"$HERE/go/containerd/go.mod" <<-EOF
		module kvgate.local/hack/containerd

		go 1.26.0

		require github.com/containerd/containerd/v2 $CONTAINERD_VERSION

		tool (
		${TAB}github.com/containerd/containerd/v2/cmd/containerd
		${TAB}github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
		${TAB}github.com/containerd/containerd/v2/cmd/ctr
		)
	EOF
	cat >"$HERE/go/kube-router/go.mod" <<-EOF
		module kvgate.local/hack/kube-router

		go 1.26.0

		require github.com/cloudnativelabs/kube-router/v2 $KUBE_ROUTER_VERSION

		tool github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
	EOF
	# Gitea: upstream's replace directives are what `go install` refuses; the wrapper copies them.
	gomod="$(cd / && GOFLAGS= go mod download -json "code.gitea.io/gitea@$GITEA_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
	mkdir -p "$HERE/go/gitea"
	cat >"$HERE/go/gitea/go.mod" <<-EOF
		module kvgate.local/hack/gitea

		go $(sed -n 's/^go //p' "$gomod")

		require code.gitea.io/gitea $GITEA_VERSION

		tool code.gitea.io/gitea
	EOF
	sed -n 's#^replace \([^ ]*\) => \([^ ]*\) \(v[^ ]*\).*#\1=\2@\3#p' "$gomod" |
		while read -r r; do (cd "$HERE/go/gitea" && go mod edit -replace="$r"); done
	# Argo CD and Flux: the same (upstream's replace directives to module versions; ./ ones are
	# the modules' own subdirectories), around our main.go for Argo CD (kept as it is).
	wrap argocd-health "github.com/argoproj/argo-cd/v3" "$ARGOCD_VERSION"
	wrap flux-source "github.com/fluxcd/source-controller" "$FLUX_SOURCE_VERSION" \
		"github.com/fluxcd/pkg/artifact=github.com/fluxcd/pkg/artifact@v0.18.1"
	wrap flux-kustomize "github.com/fluxcd/kustomize-controller" "$FLUX_KUSTOMIZE_VERSION"
	for d in flux-source flux-kustomize; do
		printf '\ntool %s\n' "$(sed -n 's/^require \([^ ]*\) .*/\1/p' "$HERE/go/$d/go.mod")" >>"$HERE/go/$d/go.mod"
	done
	for d in k8s etcd helm containerd kube-router gitea argocd-health flux-source flux-kustomize; do
		log "go mod tidy in hack/go/$d"
		# -e: test-only imports of upstream's (flux-source: fluxcd/pkg/helmtestserver) may be refused
		(cd "$HERE/go/$d" && GOFLAGS= go mod tidy -e)
	done
}

# wrap DIR MODULE VERSION [EXTRA_REPLACE...]: a wrapper go.mod requiring MODULE@VERSION with
# upstream's replace directives that name module versions (single and in blocks; comments and
# ./ paths left out), plus EXTRA_REPLACE (old=new@version).
wrap() {
	local dir="$1" mod="$2" ver="$3" gomod r
	shift 3
	gomod="$(cd / && GOFLAGS= go mod download -json "$mod@$ver" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
	mkdir -p "$HERE/go/$dir"
	printf 'module kvgate.local/hack/%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$dir" "$mod" "$ver" >"$HERE/go/$dir/go.mod"
	{
		sed -n 's#^replace \([^ /][^ ]*\) => \([^ .][^ ]*\) \(v[^ ]*\).*#\1=\2@\3#p' "$gomod"
		sed -n '/^replace (/,/^)/s#^[[:space:]]*\([^ /][^ ]*\) => \([^ .][^ ]*\) \(v[^ ]*\).*#\1=\2@\3#p' "$gomod"
		for r in "$@"; do echo "$r"; done
	} | while read -r r; do (cd "$HERE/go/$dir" && go mod edit -replace="$r"); done
}

# --- build one binary unless the cached one has the same stamp ---------------
# build NAME WRAPPER_DIR PACKAGE STAMP LDFLAGS [GO_BUILD_FLAG]
build() {
	local name="$1" dir="$2" pkg="$3" stamp="$4" ldflags="$5" extra="${6:-}" start
	if [ -x "$OUT/$name" ] && [ "$(cat "$OUT/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
		log "$name: cached ($stamp)"
		return
	fi
	start=$SECONDS
	log "$name: building $stamp (cold, all of them: about 19 min on 2 cores, downloads included)"
	# -v lists each package as it compiles: that is the progress display.
	(cd "$HERE/go/$dir" && go build -v -trimpath ${extra:+"$extra"} -ldflags "$ldflags" -o "$OUT/.$name.tmp" "$pkg") 2>&1 |
		awk -v n="$name" '{ c++; if (c % 50 == 0) printf "[build-binaries] %s: %d packages compiled (%s)\n", n, c, $0 > "/dev/stderr" }
		                  /^(#|.*\.go:[0-9]+)/ { print > "/dev/stderr" }'
	[ "${PIPESTATUS[0]}" -eq 0 ] || { log "$name: build failed"; exit 1; }
	mv -f "$OUT/.$name.tmp" "$OUT/$name"
	echo "$stamp" >"$OUT/.$name.stamp"
	log "$name: built in $((SECONDS - start)) s"
}

kube_ldflags() {
	local minor ld="-s -w" date
	minor="$(cut -d. -f2 <<<"$KUBE_VERSION")"
	date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
		ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
	done
	echo "$ld"
}

# --- --forge: Gitea, the loopback Git forge with a pull-request API for tests --
# `go install code.gitea.io/gitea@v1.26.0` refuses upstream's replace directives;
# hack/go/gitea/ carries them (v1.27+ declares `module gitea.dev`, which the module
# proxy refuses). Gitea v1.26's only embedded database is SQLite through
# mattn/go-sqlite3, which needs cgo (`-tags sqlite`), so this one build has cgo on.
# No `bindata` tag (that needs the npm asset build): Gitea reads options/ and
# templates/ from STATIC_ROOT_PATH, copied from the module next to the binary.
build_forge() {
	local dir stamp="$GITEA_VERSION sqlite,sqlite_unlock_notify"
	if [ "$(cat "$OUT/.gitea.stamp" 2>/dev/null)" != "$stamp" ] && ! command -v "${CC:-gcc}" >/dev/null; then
		log "gitea: a C compiler (${CC:-gcc}) is needed: cgo, for SQLite"
		exit 1
	fi
	export CGO_ENABLED=1
	build gitea gitea code.gitea.io/gitea "$stamp" \
		"-s -w -X main.Version=${GITEA_VERSION#v} -X 'main.Tags=sqlite sqlite_unlock_notify'" \
		-tags=sqlite,sqlite_unlock_notify
	if [ "$(cat "$OUT/gitea-assets/.stamp" 2>/dev/null)" != "$GITEA_VERSION" ]; then
		dir="$(cd "$HERE/go/gitea" && GOFLAGS=-mod=mod go mod download -json code.gitea.io/gitea |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
		[ -d "$dir/templates" ] || { log "gitea: module source not found ($dir)"; exit 1; }
		rm -rf "$OUT/gitea-assets" && mkdir -p "$OUT/gitea-assets"
		cp -r "$dir/options" "$dir/templates" "$dir/public" "$OUT/gitea-assets/"
		chmod -R u+w "$OUT/gitea-assets"
		echo "$GITEA_VERSION" >"$OUT/gitea-assets/.stamp"
	fi
}

# --- --gitops: Argo CD's own health evaluator, for charts/kvgate/argocd/health.lua --
# hack/go/argocd-health/main.go calls Argo CD's util/settings, util/lua and gitops-engine's
# health package (the application controller's path for an argocd-cm resource customization).
build_gitops() {
	local src
	# The stamp covers our main.go too: a change there rebuilds.
	src="$(cd "$HERE/go/argocd-health" && cat go.mod go.sum main.go | sha256sum | cut -c1-12)"
	build argocd-health argocd-health kvgate.local/hack/argocd-health "$ARGOCD_VERSION $src" "-s -w"
}

# --- --flux: Flux's source-controller and kustomize-controller, and their CRDs ----------------
# Both go.mods replace their api/ modules with ./api (and pin go-digest), which `go install`
# refuses: hack/go/flux-source/ and hack/go/flux-kustomize/ are the wrappers. The CRDs come from
# the same module versions (config/crd/bases/), copied next to the binaries.
build_flux() {
	local dir name ver d
	build flux-source-controller flux-source github.com/fluxcd/source-controller \
		"$FLUX_SOURCE_VERSION" "-s -w"
	build flux-kustomize-controller flux-kustomize github.com/fluxcd/kustomize-controller \
		"$FLUX_KUSTOMIZE_VERSION" "-s -w"
	if [ "$(cat "$OUT/flux-crds/.stamp" 2>/dev/null)" != "$FLUX_SOURCE_VERSION $FLUX_KUSTOMIZE_VERSION" ]; then
		rm -rf "$OUT/flux-crds" && mkdir -p "$OUT/flux-crds"
		for d in "flux-source source-controller" "flux-kustomize kustomize-controller"; do
			read -r dir name <<<"$d"
			ver="$(cd "$HERE/go/$dir" && GOFLAGS=-mod=mod go mod download -json "github.com/fluxcd/$name" |
				sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
			[ -d "$ver/config/crd/bases" ] || { log "flux: $name's CRDs not found ($ver)"; exit 1; }
			cp "$ver"/config/crd/bases/*.yaml "$OUT/flux-crds/"
		done
		chmod -R u+w "$OUT/flux-crds"
		echo "$FLUX_SOURCE_VERSION $FLUX_KUSTOMIZE_VERSION" >"$OUT/flux-crds/.stamp"
	fi
}

TAB="$(printf '\t')"
FLUX=""
NODE=""
FORGE=""
GITOPS=""
case "${1:-}" in
--print) echo "$OUT"; exit 0 ;;
--update) update_wrappers; exit 0 ;;
--node) NODE=1 ;;
--forge) FORGE=1 ;;
--gitops) GITOPS=1 ;;
--flux) FLUX=1 ;;
"") ;;
*) echo "usage: $0 [--node|--forge|--gitops|--flux|--print|--update]" >&2; exit 2 ;;
esac

command -v go >/dev/null || { log "go is not on PATH: install Go >= 1.26"; exit 1; }
mkdir -p "$OUT"
if [ -n "$FORGE" ]; then
	build_forge
	echo "$OUT"
	exit 0
fi
if [ -n "$GITOPS" ]; then
	build_gitops
	echo "$OUT"
	exit 0
fi
if [ -n "$FLUX" ]; then
	build_flux
	echo "$OUT"
	exit 0
fi
KLD="$(kube_ldflags)"
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	build "$b" k8s "k8s.io/kubernetes/cmd/$b" "$KUBE_VERSION" "$KLD"
done
build etcd etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" \
	"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}"
build helm helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" \
	"-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
if [ -n "$NODE" ]; then
	for b in kubelet kube-proxy; do
		build "$b" k8s "k8s.io/kubernetes/cmd/$b" "$KUBE_VERSION" "$KLD"
	done
	# The NetworkPolicy engine (before containerd's build tags, which it does not need).
	build kube-router kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
		"$KUBE_ROUTER_VERSION" \
		"-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
	# No btrfs, devmapper or zfs snapshotters: overlayfs and native serve, and their cgo is avoided.
	export GOFLAGS="$GOFLAGS -tags=no_btrfs,no_devmapper,no_zfs"
	CLD="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
	for b in containerd containerd-shim-runc-v2 ctr; do
		build "$b" containerd "github.com/containerd/containerd/v2/cmd/$b" "$CONTAINERD_VERSION" "$CLD"
	done
	# The pod sandbox ("pause") program: a static binary of our own, made into an image by
	# hack/containerd_node.py (public pause images cannot be pulled here).
	build kvgate-pause pause kvgate.local/hack/pause v1 "-s -w"
fi
echo "$OUT"
