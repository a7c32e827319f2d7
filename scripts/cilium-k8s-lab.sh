#!/usr/bin/env bash
# Cilium (v1.20.2, VXLAN tunnel, --ipam=kubernetes, kube-proxy kept) in place of flannel on the
# k8s lab, benchmarked pod->pod across nodes back-to-back with flannel on the same cluster.
# A benchmark, not a test: issue 27 item 5. Opt-in; needs scripts/setup-cilium.sh's cache and a
# k8s lab brought up with `peregrine lab up --style k8s --no-agent --no-network-policy`.
#
#   sudo flock -o /tmp/prg-heavy.lock scripts/cilium-k8s-lab.sh [PEREGRINE] [OUTDIR]
#
# Order: flannel pods -> bench tcp/pingpong; stop flanneld, remove flannel's CNI config and
# links on every node; apply the CRDs, start cilium-operator if built (node 1) and cilium-agent
# (every node) inside the nodes' network and mount namespaces; new pods -> bench. Everything Cilium made is removed on
# exit (also on failure): processes, /run/cilium mounts, its links, iptables chains and pins.
# The lab itself is left up (lab down removes the nodes).
set -uo pipefail

PRG=${1:-peregrine}
OUT=${2:-/tmp/prg-cilium-out}
CACHE=${PRG_CILIUM_CACHE:-/var/cache/peregrine/cilium-v1.20.2}
K8S=/run/prg-k8s
KUBECTL=/var/cache/peregrine/k8s-v1.31.14/kubectl
KC=$K8S/pki/admin.kubeconfig
NODES=(1 2)
mkdir -p "$OUT"

say() { printf '[cilium-lab %s] %s\n' "$(date -u +%T)" "$*" >&2; }
die() { say "error: $*"; exit 1; }
k() { nsenter --net=/run/netns/prg-k8s-n1 -- "$KUBECTL" --kubeconfig="$KC" "$@"; }
onnode() { local i=$1; shift; nsenter --net=/run/netns/prg-k8s-n$i --mount=$K8S/mnt/n$i -- "$@"; }

[[ -f $K8S/cluster.json ]] || die "no k8s lab: peregrine lab up --style k8s --no-agent --no-network-policy"
for b in cilium-agent cilium-cni; do
  [[ -x $CACHE/bin/$b ]] || die "$CACHE/bin/$b missing: run scripts/setup-cilium.sh"
done
command -v clang-19 >/dev/null || die "clang-19 missing: run scripts/setup-cilium.sh"

# Machine-wide sysctls the agent may write (besides the two covered per node below): restored.
SYSCTLS=(net/core/bpf_jit_enable net/core/fb_tunnels_only_for_init_net kernel/unprivileged_bpf_disabled kernel/timer_migration)
declare -A saved
for s in "${SYSCTLS[@]}"; do saved[$s]=$(cat /proc/sys/$s); done
pids=()
cleanup() {
  say "cleanup"
  # Pods first, while cilium-cni still has an agent to answer its DEL.
  k delete pod prg-cil-a prg-cil-b --now --ignore-not-found --timeout=30s >/dev/null 2>&1
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del prg-cil-a 2>/dev/null; ip netns del prg-cil-b 2>/dev/null
  for i in "${NODES[@]}"; do
    # The agent's own uninstall path: iptables CILIUM_* chains, cilium_* links, pins.
    [[ -x $CACHE/bin/cilium-dbg ]] && onnode "$i" "$CACHE/bin/cilium-dbg" post-uninstall-cleanup -f --all-state >/dev/null 2>&1
    for l in $(onnode "$i" ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^(cilium_|lxc)'); do
      onnode "$i" ip link del "$l" 2>/dev/null
    done
    onnode "$i" sh -c 'for t in filter nat mangle raw; do iptables-save -t $t | grep -q CILIUM || continue;
      iptables-save -t $t | grep -v CILIUM | iptables-restore -T $t; done' 2>/dev/null
    onnode "$i" sh -c 'rm -rf /sys/fs/bpf/cilium /sys/fs/bpf/tc/globals/cilium_* 2>/dev/null
      umount /proc/sys/kernel/unprivileged_bpf_disabled /proc/sys/kernel/timer_migration /run/cilium/bpffs /run/cilium/cgroupv2 /run/cilium 2>/dev/null; true'
    rm -f $K8S/n$i/cni-conf/05-cilium.conflist
  done
  rm -f $K8S/cni-bin/cilium-cni
  # /run/cilium: the nodes' tmpfs mount point, made on the host's /run through their mount ns.
  [[ -n ${made_run_cilium:-} ]] && rmdir /run/cilium 2>/dev/null
  for s in "${SYSCTLS[@]}"; do
    [[ $(cat /proc/sys/$s) == "${saved[$s]}" ]] || { say "host sysctl $s changed to $(cat /proc/sys/$s): restoring ${saved[$s]}"; echo "${saved[$s]}" >/proc/sys/$s; }
  done
}
trap cleanup EXIT

# pods NAME NODE: a busybox pod pinned to a node; then its netns attached on the host as NAME.
pods() {
  for spec in "prg-cil-a 1" "prg-cil-b 2"; do
    set -- $spec
    k apply -f - >/dev/null <<EOF || return 1
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {app: prg-cil}}
spec:
  nodeName: prg-k8s-n$2
  terminationGracePeriodSeconds: 0
  containers:
  - {name: c, image: localhost/busybox:1.35, imagePullPolicy: Never, command: [sleep, "360$2$2"]}
EOF
  done
  k wait --for=condition=Ready pod/prg-cil-a pod/prg-cil-b --timeout=90s >&2 || return 1
  for n in prg-cil-a prg-cil-b; do
    local tag=${n: -1}; local arg; [[ $tag == a ]] && arg=36011 || arg=36022
    local pid; pid=$(pgrep -f "^sleep $arg\$" | head -1)
    [[ -n $pid ]] || { say "no process for $n"; return 1; }
    ip netns del "$n" 2>/dev/null; ip netns attach "$n" "$pid" || return 1
  done
  B_IP=$(k get pod prg-cil-b -o jsonpath='{.status.podIP}')
  A_IP=$(k get pod prg-cil-a -o jsonpath='{.status.podIP}')
  say "pods: prg-cil-a $A_IP (n1), prg-cil-b $B_IP (n2)"
  ip netns exec prg-cil-a ping -c 3 -W 1 "$B_IP" >&2 || { say "pod a cannot reach pod b"; return 1; }
}

bench() { # bench LABEL
  for sc in tcp pingpong; do
    say "bench $sc ($1)"
    "$PRG" bench run "$sc" --client-ns prg-cil-a --server-ns prg-cil-b --server-addr "$B_IP" \
      --reps 3 --no-report --out "$OUT/$1" --json >"$OUT/$1-$sc.json" 2>"$OUT/$1-$sc.log" || { tail -5 "$OUT/$1-$sc.log" >&2; return 1; }
  done
}

phase=${PHASE:-all}
if [[ $phase == all || $phase == flannel ]]; then
  pods || die "flannel pods"
  bench flannel || die "flannel bench"
  k delete pod prg-cil-a prg-cil-b --now >/dev/null; ip netns del prg-cil-a; ip netns del prg-cil-b
fi

say "flannel out: flanneld stopped, its CNI config and links removed"
for i in "${NODES[@]}"; do
  kill "$(cat $K8S/run/flanneld-n$i.pid)" 2>/dev/null
  rm -f $K8S/n$i/cni-conf/10-flannel.conflist
  onnode "$i" ip link del flannel.1 2>/dev/null
  onnode "$i" ip link del cni0 2>/dev/null
done

say "cilium in"
ln -sf "$CACHE/bin/cilium-cni" $K8S/cni-bin/cilium-cni
[[ -e /run/cilium ]] || made_run_cilium=1
for v in v2 v2alpha1; do k apply -f "$CACHE/src/pkg/k8s/apis/cilium.io/client/crds/$v/" >/dev/null 2>&1 || true; done
for i in "${NODES[@]}"; do
  # The agent writes two machine-wide sysctls (pkg/datapath/loader/base.go): it sets
  # kernel.unprivileged_bpf_disabled=1, which cannot be undone until a reboot (the host has 2),
  # and kernel.timer_migration=0. In the node's mount namespace both files are covered by
  # files of its own, so the host's values never change.
  # bpffs and cgroup2 of its own under /run/cilium: the node's /sys/fs/bpf is a mount over a
  # covered one (the host's, under the node's own sysfs), and the agent refuses that ("multiple
  # mount points detected at /sys/fs/bpf").
  onnode "$i" sh -c 'set -e; mkdir -p /run/cilium && mount -t tmpfs -o mode=755 prg-cilium-run /run/cilium
    mkdir /run/cilium/bpffs /run/cilium/cgroupv2
    mount -t bpf -o mode=700 prg-cilium-bpf /run/cilium/bpffs; mount -t cgroup2 prg-cilium-cg /run/cilium/cgroupv2
    for s in kernel/unprivileged_bpf_disabled kernel/timer_migration; do
      f=/run/cilium/sysctl-${s#*/}; cat /proc/sys/$s >$f; mount --bind $f /proc/sys/$s; done' || die "node $i: /run/cilium"
  cat >$K8S/n$i/cni-conf/05-cilium.conflist <<'EOF'
{"cniVersion": "0.3.1", "name": "cilium", "plugins": [{"type": "cilium-cni", "enable-debug": false}]}
EOF
done
# The operator registers the CRDs (applied above as well, from the source's YAML, so the agent
# never waits on it) and garbage-collects identities; with --ipam=kubernetes it hands out nothing.
# Started with nsenter itself (not the onnode function, which would run in a subshell): $! is
# then the daemon (nsenter execs it), and the cleanup's kill reaches it.
if [[ -x $CACHE/bin/cilium-operator ]]; then
nsenter --net=/run/netns/prg-k8s-n1 --mount=$K8S/mnt/n1 -- "$CACHE/bin/cilium-operator" --k8s-kubeconfig-path="$KC" --ipam=kubernetes --cluster-name=default \
  --identity-allocation-mode=crd --enable-metrics=false --operator-api-serve-addr=127.0.0.1:9234 \
  --operator-pprof=false --enable-gateway-api-secrets-sync=false --enable-ingress-controller=false \
  >"$OUT/operator.log" 2>&1 &
pids+=($!)
fi
for i in "${NODES[@]}"; do
  # PATH: the agent runs "clang"/"llc" by name for its datapath; Cilium 1.20 wants LLVM >= 18.1.
  nsenter --net=/run/netns/prg-k8s-n$i --mount=$K8S/mnt/n$i -- env PATH=/usr/lib/llvm-19/bin:$PATH K8S_NODE_NAME=prg-k8s-n$i "$CACHE/bin/cilium-agent" \
    --k8s-kubeconfig-path="$KC" --routing-mode=tunnel --tunnel-protocol=vxlan --ipam=kubernetes \
    --enable-ipv4=true --enable-ipv6=false --kube-proxy-replacement=false --bpf-lb-sock=false \
    --enable-l7-proxy=false --enable-envoy-config=false --enable-hubble=false --enable-health-checking=false \
    --enable-endpoint-health-checking=false --devices=eth0 --lib-dir="$CACHE/src" --state-dir=/run/cilium \
    --bpf-root=/run/cilium/bpffs --cgroup-root=/run/cilium/cgroupv2 --cni-exclusive=false \
    --identity-allocation-mode=crd --cluster-name=default --enable-policy=default \
    >"$OUT/agent-n$i.log" 2>&1 &
  pids+=($!)
done
for t in $(seq 1 180); do
  ok=0
  for i in "${NODES[@]}"; do
    onnode "$i" test -S /run/cilium/cilium.sock && grep -q "Daemon initialization completed" "$OUT/agent-n$i.log" && ok=$((ok+1))
  done
  ((ok == ${#NODES[@]})) && break
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || die "a Cilium process exited: see $OUT/*.log"; done
  sleep 1
done
((ok == ${#NODES[@]})) || die "cilium agents not ready in 180 s: see $OUT/agent-n*.log"
say "cilium agents ready after ${t}s"
pods || die "cilium pods"
# The agents compile their datapath with clang while the first endpoints come up (5-17 s a
# template on this machine): measure only once their logs have been quiet for 20 s.
for t in $(seq 1 120); do
  last=$(stat -c %Y "$OUT"/agent-n*.log | sort -n | tail -1)
  (( $(date +%s) - last >= 20 )) && ! pgrep -x clang >/dev/null && break
  sleep 1
done
say "agents quiet after ${t}s more"
bench cilium || die "cilium bench"
say "done: $OUT"
