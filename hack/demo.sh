#!/usr/bin/env bash
# kvgate end to end, narrated: the project's images, a local control plane with a real node
# (kubelet + kube-proxy on containerd), the Helm chart, a simulated vLLM Deployment on an L4,
# and two FP8 KV-cache rollouts, one rolled back, one promoted; then real vLLM (CPU, a tiny
# model): what FP8 buys measured, and a rollout of it (hack/demo_real_engine.py).
#
#   hack/demo.sh            # run it, then tear everything down
#   hack/demo.sh --keep     # leave the cluster up afterwards (or KEEP=1)
#   NODE=process hack/demo.sh   # the process kubelet instead (no images, no root needed)
#
# Every wait has a deadline; on failure it prints what went wrong and tears down.
# Environment: KVGATE_GSM8K_DIR (default ../shared/data/gsm8k next to the checkout),
# KVGATE_DEMO_DIR (cluster state, default ~/.cache/kvgate/demo), DEMO_TIMEOUT (seconds
# per rollout, default 900), NODE (containerd or process, default containerd).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KEEP="${KEEP:-0}"
for arg in "$@"; do
	case "$arg" in
	--keep) KEEP=1 ;;
	-h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
	esac
done

PY="$ROOT/.venv/bin/python"
STATE="${KVGATE_DEMO_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/demo}"
GSM8K="${KVGATE_GSM8K_DIR:-$(cd "$ROOT/.." && pwd)/shared/data/gsm8k}"
NS=kvgate-demo
OPNS=kvgate-system
RELEASE=kvgate
DEMO_TIMEOUT="${DEMO_TIMEOUT:-900}"
NODE="${NODE:-containerd}"
OUT="$STATE/out"
T0=$SECONDS

if [ -t 1 ]; then B=$'\e[1m' D=$'\e[2m' G=$'\e[32m' R=$'\e[31m' N=$'\e[0m'; else B= D= G= R= N=; fi
say() { printf '%s\n' "$*"; }
step() { printf '\n%s== %s%s %s(%ss)%s\n' "$B" "$*" "$N" "$D" "$((SECONDS - T0))" "$N"; }
fail() { printf '%sdemo failed: %s%s\n' "$R" "$*" "$N" >&2; exit 1; }

[ -x "$PY" ] || fail "no $PY; run \`make install\` (or \`make demo\`, which does it)"
[ -f "$GSM8K/test.jsonl" ] || fail "GSM8K not found in $GSM8K (set KVGATE_GSM8K_DIR)"
export PATH="$ROOT/.venv/bin:$PATH"
export KVGATE_GSM8K_DIR="$GSM8K"
mkdir -p "$STATE" "$OUT"

# ---- 1. binaries and images ---------------------------------------------------------------
step "Binaries of the control plane and the node"
BIN="$(hack/build-binaries.sh --print)"
if ! "$PY" -c "import sys; sys.path.insert(0, 'hack'); from cluster import missing_binaries; import containerd_node; from pathlib import Path; b = Path('$BIN'); sys.exit(1 if missing_binaries(b) or not (b / 'helm').exists() or ('$NODE' == 'containerd' and containerd_node.missing(b)) else 0)"; then
	say "Building kube-apiserver, etcd, kubectl, helm, kubelet, containerd... from Go modules (once)."
	hack/build-binaries.sh --node
fi
export PATH="$BIN:$PATH"
say "using $BIN"
if [ "$NODE" = containerd ]; then
	step "Images: the Dockerfile's operator, eval and load targets (buildah; cached by content hash)"
	KVGATE_IMAGE_ARCHIVE_DIR="$STATE/images" hack/build-images.sh 2>"$OUT/images.err" | sed 's/^/  /' ||
		fail "image build: $(grep -v -e pytablewriter -e pathvalidate -e '~~~' -e 'pip<24.1' "$OUT/images.err" | tail -5)"
fi

# ---- teardown and diagnostics -----------------------------------------------------------
CLUSTER_UP=0
finish() {
	local rc=$?
	set +e
	if [ "$rc" -ne 0 ] && [ "$CLUSTER_UP" = 1 ]; then
		printf '\n%s== What went wrong%s\n' "$R" "$N" >&2
		kubectl get pods -A -o wide --request-timeout=10s >&2
		say "-- operator log (last 40 lines)" >&2
		kubectl logs -n "$OPNS" "deployment/$RELEASE" --tail=40 --request-timeout=10s >&2
		say "-- events in $NS (last 20)" >&2
		kubectl get events -n "$NS" --sort-by=.lastTimestamp --request-timeout=10s 2>/dev/null | tail -20 >&2
	fi
	if [ "$CLUSTER_UP" = 1 ]; then
		if [ "$KEEP" = 1 ]; then
			printf '\n%sCluster left running.%s\n  export KUBECONFIG=%s\n  %s hack/cluster.py down --state-dir %s\n' \
				"$B" "$N" "$KUBECONFIG" "$PY" "$STATE/cluster"
		else
			step "Tear down"
			timeout 90 "$PY" hack/cluster.py down --state-dir "$STATE/cluster" 2>&1 | sed 's/^/  /'
		fi
	fi
	exit "$rc"
}
NARRATOR=
trap finish EXIT
trap '[ -n "$NARRATOR" ] && kill "$NARRATOR" 2>/dev/null; exit 130' INT TERM

# ---- 2. cluster ---------------------------------------------------------------------------
if [ "$NODE" = containerd ]; then
	step "Local control plane (etcd, kube-apiserver, controller-manager, scheduler) and a node (kubelet, kube-proxy, containerd)"
else
	step "Local control plane (etcd, kube-apiserver, controller-manager, scheduler, test kubelet)"
fi
# A cluster left by `--keep` is replaced: the demo starts from an empty etcd.
timeout 90 "$PY" hack/cluster.py down --state-dir "$STATE/cluster" >/dev/null 2>&1 || true
CLUSTER_UP=1
KUBECONFIG="$(timeout 400 "$PY" hack/cluster.py up --state-dir "$STATE/cluster" --bin-dir "$BIN" --timeout 300 --node "$NODE")" ||
	fail "the control plane did not start; see $STATE/cluster/supervisor.log"
export KUBECONFIG
EVAL_IMPORT=
if [ "$NODE" = containerd ]; then
	timeout 900 "$PY" hack/cluster.py import --state-dir "$STATE/cluster" "$STATE/images/kvgate.tar" 2>&1 | sed 's/^/  /'
	[ "${PIPESTATUS[0]}" -eq 0 ] || fail "importing the operator image into the node failed"
	# The eval and load images are first needed by rollout 2: import them meanwhile.
	{ timeout 900 "$PY" hack/cluster.py import --state-dir "$STATE/cluster" "$STATE/images/kvgate-eval.tar" &&
		timeout 900 "$PY" hack/cluster.py import --state-dir "$STATE/cluster" "$STATE/images/kvgate-load.tar"; } >"$OUT/import-eval.txt" 2>&1 &
	EVAL_IMPORT=$!
fi
kubectl get nodes -o wide --request-timeout=10s | sed 's/^/  /'

# ---- 3. the operator, from the chart -------------------------------------------------------
step "Install kvgate with Helm (the operator runs as a pod under the chart's ServiceAccount)"
kubectl create namespace "$NS" --request-timeout=10s >/dev/null
if [ "$NODE" = containerd ]; then
	# The images carry GSM8K at /data/gsm8k (hack/build-images.sh): nothing else is special.
	chart_args=(--set config.gsm8kDir=/data/gsm8k)
else
	# Pods of the test kubelet are host processes: give the operator ports nothing else holds,
	# and no /tmp mount (it would hide the kubelet's pod directories under /tmp).
	free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
	chart_args=(--set "config.gsm8kDir=$GSM8K" --set writableTmp=false
		--set "metrics.port=$(free_port)" --set "health.port=$(free_port)")
fi
timeout 300 helm install "$RELEASE" charts/kvgate --namespace "$OPNS" --create-namespace \
	--set watch.allNamespaces=false --set "watch.namespaces={$NS}" \
	--set config.pollInterval=1 --set logFormat=plain "${chart_args[@]}" \
	--wait --timeout 240s >"$OUT/helm-install.txt" 2>&1 || fail "helm install: $(tail -5 "$OUT/helm-install.txt")"
say "  release $RELEASE in $OPNS: $(kubectl get deploy -n "$OPNS" "$RELEASE" -o jsonpath='{.status.readyReplicas}/{.spec.replicas}' --request-timeout=10s) ready"
say "  ServiceAccount $(kubectl get deploy -n "$OPNS" "$RELEASE" -o jsonpath='{.spec.template.spec.serviceAccountName}'), Role in $NS only"
if [ "$NODE" = containerd ]; then
	say "  operator pod: $(kubectl get pods -n "$OPNS" -l app.kubernetes.io/name=kvgate -o jsonpath='{.items[0].status.containerStatuses[0].imageID}' --request-timeout=10s)"
	say "  runs as UID $(kubectl exec -n "$OPNS" "deployment/$RELEASE" --request-timeout=20s -- python -c 'import os; print(os.getuid())'), root file system: $(kubectl exec -n "$OPNS" "deployment/$RELEASE" --request-timeout=20s -- sh -c 'touch /opt/x 2>/dev/null && echo writable || echo read-only')"
fi

# ---- 4. production ---------------------------------------------------------------------
step "Production: vLLM serving Qwen3-8B in BF16 on one L4 (simulated), under load"
kubectl apply -n "$NS" -f examples/vllm-deployment.yaml --request-timeout=10s | sed 's/^/  /'
kubectl rollout status -n "$NS" deployment/vllm --timeout=180s | sed 's/^/  /' || fail "the vLLM Deployment never became ready"
say "  args: $(kubectl get deploy -n "$NS" vllm -o jsonpath='{.spec.template.spec.containers[0].args}')"

# The example claims a KV-bound production. Wait until the pod's own /metrics say so, read as an
# SRE would (kvgate scrape, the operator's rule), in two windows in a row: a busy machine fills
# the pool later, and a rollout applied before that would rightly end NotNeeded.
wait_for_pressure() {
	local deadline=$((SECONDS + ${DEMO_PRESSURE_TIMEOUT:-300})) streak=0 ip out last="no sample yet"
	while [ "$streak" -lt 2 ]; do
		[ "$SECONDS" -lt "$deadline" ] || fail "production's KV pool never came under pressure: $last"
		ip="$(kubectl get pods -n "$NS" -l app.kubernetes.io/name=vllm --field-selector=status.phase=Running \
			-o jsonpath='{.items[0].status.podIP}' --request-timeout=10s 2>/dev/null)"
		out=""
		[ -n "$ip" ] && out="$(kvgate scrape "http://$ip:8000/metrics" --samples 4 --interval 2 --json 2>/dev/null)"
		last="$("$PY" - "${out:-null}" <<-'PYEOF'
			import json, sys
			try:
			    p = json.loads(sys.argv[1])["pool_pressure"]
			    print(f"{p['pressured_samples']}/{p['samples']} samples full (requests waiting, or a preemption), "
			          f"max KV usage {p['max_usage']:.0%}, pressured={p['pressured']}")
			except Exception:
			    print("no readable sample yet")
		PYEOF
		)"
		case "$last" in *pressured=True) streak=$((streak + 1)) ;; *) streak=0 ;; esac
	done
	say "  pool under pressure: $last"
}
wait_for_pressure

# What FP8 buys, measured: the load gate runs inference-perf on both canaries at production's
# load. Its pod runs the load image on the containerd node; the process kubelet's pods are host
# processes and find inference-perf in the load venv (`make loadenv`), without which it is off.
# minRatio 1.1: the simulator, paced 100x, is partly CPU-bound on 2 cores (both arms and
# inference-perf share them), so a busy host squeezes the gain its engine model gives (1.5x to
# 2x at 64). Measured with the canaries serving only the Jobs (production's traffic reaches
# production's pods alone): 1.40x under `stress-ng --cpu 2` (FP8 TPOT +2% at 8 concurrent, where
# both pools hold the requests); before that change 1.20x to 1.57x. The line says what was measured.
THROUGHPUT_GATE="throughputGain: {minRatio: 1.1, maxConcurrency: 64}"
if [ "$NODE" = process ] && ! [ -x "$ROOT/.venv-load/bin/inference-perf" ]; then
	THROUGHPUT_GATE=""
	say "  ${D}no .venv-load/bin/inference-perf (make loadenv): the throughput gate is off for this run${N}"
fi

# A rollout for the demo: the gates of examples/auto.yaml, scaled down to a few minutes.
rollout() { # name, extra args as a JSON list
	cat <<-EOF
		apiVersion: kvgate.io/v1alpha1
		kind: KVCacheRollout
		metadata:
		  name: $1
		spec:
		  targetRef: {name: vllm}
		  kvCacheDtype: fp8
		  extraArgs: $2
		  gates:
		    capacity: {mode: require, window: 10s, samples: 4}
		    scales: {mode: warn}
		    accuracy: {questions: 200, chunk: 50, margin: 3}
		    capacityGain: {minRatio: 1.8${THROUGHPUT_GATE:+, $THROUGHPUT_GATE}}
		  canary: {startupTimeout: 5m, evalTimeout: 10m, evalRetries: 1}
		  promotion: {mode: auto, verifyWindow: 10s}
	EOF
}

# Follow one rollout: a line per phase change and per new Event, until it ends or the deadline.
narrate() { # name, expected final phase
	# In the background, so that `wait` (unlike a foreground child) lets INT/TERM through.
	"$PY" - "$NS" "$1" "$2" "$DEMO_TIMEOUT" <<-'PYEOF' &
		import json, re, subprocess, sys, time
		ns, name, expected, limit = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
		tty = sys.stdout.isatty()
		def c(code, text): return f"\033[{code}m{text}\033[0m" if tty else text
		def kubectl(*args):
		    p = subprocess.run(["kubectl", *args, "--request-timeout=10s"], capture_output=True, text=True, timeout=20)
		    return json.loads(p.stdout) if p.returncode == 0 and p.stdout else None
		terminal = {"Promoted", "RolledBack", "NotNeeded", "Failed"}
		t0, seen, phase, look, shown = time.monotonic(), set(), None, None, None
		while True:
		    now = time.monotonic() - t0
		    obj = kubectl("get", "kvr", name, "-n", ns, "-o", "json") or {}
		    status = obj.get("status") or {}
		    progress = (status.get("eval") or {}).get("progress") or {}
		    if progress.get("look") is not None and progress.get("look") != look:
		        look = progress["look"]
		        diff = progress.get("difference")
		        diff = f", candidate - control {100 * diff:+.1f} pp" if isinstance(diff, (int, float)) else ""
		        print(f"  {now:6.1f}s {c('2', '·')} eval look {look}/{progress.get('looksPlanned', '?')}: "
		              f"{progress.get('questions', '?')} questions{diff}", flush=True)
		    events = kubectl("get", "events", "-n", ns, "--field-selector",
		                     f"involvedObject.kind=KVCacheRollout,involvedObject.name={name}", "-o", "json") or {}
		    for ev in sorted(events.get("items", []), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
		        uid = ev["metadata"]["uid"]
		        if uid in seen:
		            continue
		        seen.add(uid)
		        mark = c("33", "!") if ev.get("type") == "Warning" else c("2", "·")
		        print(f"  {now:6.1f}s {mark} {ev.get('reason')}: {ev.get('message', '')[:130]}", flush=True)
		    if status.get("phase") and status["phase"] != phase:
		        phase = status["phase"]
		        color = "32" if phase in ("Promoted", "NotNeeded") else "31" if phase in ("RolledBack", "Failed") else "36"
		        msg = (status.get("message") or "")[:140]
		        shown = status.get("message")
		        print(f"  {now:6.1f}s {c('1;' + color, '→ ' + phase)}  {msg}", flush=True)
		    elif phase == "Measuring" and status.get("message"):
		        # the load Job's progress ("stages control 2/4, ..."), when a stage ends
		        stages = re.sub(r";[^;]*elapsed.*$", "", status["message"])
		        if stages != shown:
		            shown = stages
		            print(f"  {now:6.1f}s {c('2', '·')} load: {stages[:130]}", flush=True)
		    done = phase in terminal or (phase == "AwaitingApproval" and status.get("reason") == "VerdictReported")
		    if done:
		        sys.exit(0 if phase == expected else 1)
		    if now > limit:
		        print(f"  {c('31', 'timed out')} after {limit:.0f}s in phase {phase}", flush=True)
		        sys.exit(1)
		    time.sleep(1.0)
	PYEOF
	NARRATOR=$!
	wait "$NARRATOR"
}

# ---- 5. the first rollout: default backend ----------------------------------------------
step "Rollout 1: --kv-cache-dtype fp8 with vLLM's default attention backend"
say "${D}On an L4 (SM 8.9) FlashInfer cannot build its FP8 KV kernels: the candidate should crash.${N}"
rollout qwen3-fp8 '[]' | kubectl apply -n "$NS" -f - --request-timeout=10s | sed 's/^/  /'
narrate qwen3-fp8 RolledBack || fail "rollout qwen3-fp8 did not end RolledBack"
MESSAGE="$(kubectl get kvr -n "$NS" qwen3-fp8 -o jsonpath='{.status.message}' --request-timeout=10s)"
# The operator's crash message (kvgate/judge/crash.py): "candidate crashed: <cause>; remedy[ for
# <engine> <version>]: <what>; <where it goes>; log: <the engine's line>".
say "  why:    ${MESSAGE%%; remedy*}" | cut -c1-160
REMEDY="${MESSAGE#*; remedy}"
case "$MESSAGE" in *"; remedy"*) say "  ${B}remedy${REMEDY%%; log: *}${N}" ;; esac
say "  production args unchanged: $(kubectl get deploy -n "$NS" vllm -o jsonpath='{.spec.template.spec.containers[0].args}')"

# ---- 6. the second rollout: Triton attention ---------------------------------------------
if [ -n "$EVAL_IMPORT" ]; then
	wait "$EVAL_IMPORT" || fail "importing the eval image into the node failed: $(tail -3 "$OUT/import-eval.txt")"
	sed 's/^/  /' "$OUT/import-eval.txt"
fi
step "Rollout 2: --kv-cache-dtype fp8 --attention-backend TRITON_ATTN"
say "${D}Qwen3-8B ships no KV scales (a warning, scale 1.0); the paired GSM8K gate decides.${N}"
rollout qwen3-fp8-triton '["--attention-backend", "TRITON_ATTN"]' | kubectl apply -n "$NS" -f - --request-timeout=10s | sed 's/^/  /'
narrate qwen3-fp8-triton Promoted || fail "rollout qwen3-fp8-triton was not promoted"
say "  production args now: $(kubectl get deploy -n "$NS" vllm -o jsonpath='{.spec.template.spec.containers[0].args}')"
if [ -n "$THROUGHPUT_GATE" ]; then
	# The throughput gate's one line: what the change buys at production's load.
	say "  ${B}what FP8 buys:${N} $(kubectl get kvr -n "$NS" qwen3-fp8-triton -o jsonpath='{.status.gates.throughputGain.message}' --request-timeout=10s)"
fi

# ---- 7. the record ------------------------------------------------------------------------
step "kubectl get kvr"
kubectl get kvr -n "$NS" --request-timeout=10s
kubectl get kvr -n "$NS" -o json --request-timeout=10s >"$OUT/rollouts.json"
step "Events"
kubectl get events -n "$NS" --field-selector involvedObject.kind=KVCacheRollout \
	--sort-by=.lastTimestamp --request-timeout=10s \
	-o custom-columns='TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message' | cut -c1-150
step "kvgate report qwen3-fp8-triton"
kvgate report qwen3-fp8-triton -n "$NS" --html "$OUT/report.html"
kvgate report qwen3-fp8 -n "$NS" --html "$OUT/report-rolled-back.html" >/dev/null

# ---- 8. the real engine -------------------------------------------------------------------
# Everything above ran the simulator (an L4 and Qwen3-8B, as kvgate.sim models them). The last
# part runs real vLLM 0.32, its CPU build (`make vllmenv`), on a tiny random Qwen3 built offline:
# the numbers (BF16 vs FP8 in the same pool, measured), then a rollout of a real vLLM Deployment
# on a small cluster of its own with the process kubelet (there is no vLLM image for the
# containerd node: it would be 6 GB), the operator as `kvgate run`. The simulated cluster goes
# first (unless --keep): the real engine wants the cores for itself.
if [ "$CLUSTER_UP" = 1 ] && [ "$KEEP" != 1 ]; then
	step "Tear down the simulated cluster"
	timeout 90 "$PY" hack/cluster.py down --state-dir "$STATE/cluster" 2>&1 | sed 's/^/  /'
	CLUSTER_UP=0
fi
[ -x "$ROOT/.venv-vllm/bin/python" ] || fail "no real vLLM at $ROOT/.venv-vllm: run \`make vllmenv\`"
# In the background, as the narrator: INT/TERM reach it, and it tears down what it started.
"$PY" hack/demo_real_engine.py --state-dir "$STATE/real-engine" --bin-dir "$BIN" --timeout "$DEMO_TIMEOUT" \
	--elapsed "$((SECONDS - T0))" &
NARRATOR=$!
wait "$NARRATOR" || fail "the real-engine part failed (its logs: $STATE/real-engine/logs)"

say "${G}Demo done in $((SECONDS - T0)) s.${N} HTML reports: $OUT/report.html, $OUT/report-rolled-back.html"
say "The rollouts as JSON: $OUT/rollouts.json (kvgate report qwen3-fp8 -f $OUT/rollouts.json)"
