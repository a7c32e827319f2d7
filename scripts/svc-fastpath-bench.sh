#!/usr/bin/env bash
# One TCP flow (iperf3) from a pod to a ClusterIP (Service default/one, one backend on the other
# host) and to the backend pod's own address, vanilla and with `attach fastpath`, in one run:
# interleaved repetitions, medians, and the ratios the issue asks for. `peregrine bench compare
# --via-service` measures through the ClusterIP too, one target per run; this script pairs the
# ClusterIP and the pod within each rep. Builds its own lab (prg-svb-*), removes it on exit.
#   sudo scripts/svc-fastpath-bench.sh [--reps N] [--secs S] [--proxy-mode iptables|nftables] [--bin PATH]
set -euo pipefail
reps=5 secs=5 mode=iptables bin=${PEREGRINE:-peregrine}
while [[ $# -gt 0 ]]; do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --secs) secs=$2; shift 2 ;;
    --proxy-mode) mode=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $reps =~ ^[1-9][0-9]?$ && $secs =~ ^[1-9][0-9]?$ ]] || { echo "--reps and --secs: 1-99" >&2; exit 2; }
[[ $mode == iptables || $mode == nftables ]] || { echo "--proxy-mode: iptables or nftables" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "run as root" >&2; exit 1; }
name=svb
cleanup() { "$bin" detach --lab --name "$name" >/dev/null 2>&1 || true; "$bin" lab down --name "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$bin" lab up --name "$name" --style flannel --containers 2 --services --proxy-mode "$mode" --rx-cpus 0 >/dev/null
svcip=$("$bin" lab status --name "$name" --json | grep -o '"cluster_ip": *"[0-9.]*' | head -1 | grep -o '[0-9.]*$' || true)
[[ -n $svcip ]] || { echo "no Service in lab status" >&2; exit 1; }
svc="$svcip:80"
pod="198.19.2.2:47999" # default/one's backend: h2-c1, the Services' target port
"$bin" lab exec --name "$name" h2-c1 -- iperf3 -s -D -p 47999
sleep 0.5
# one run: prints "<Gbit/s> <retransmits>"
one() {
  local out
  out=$("$bin" lab exec --name "$name" h1-c1 -- iperf3 -c "${1%:*}" -p "${1#*:}" -t "$secs" -f g)
  awk '/sender$/ {retr=$(NF-1)} /receiver$/ {for (i=1;i<=NF;i++) if ($i=="Gbits/sec") bw=$(i-1)} END {print bw, retr}' <<<"$out"
}
declare -A res
for ((r = 1; r <= reps; r++)); do
  for m in vanilla fastpath; do
    [[ $m == fastpath ]] && "$bin" attach fastpath --lab --name "$name" >/dev/null
    for t in svc pod; do
      target=$svc; [[ $t == pod ]] && target=$pod
      read -r bw retr < <(one "$target")
      echo "rep $r $m $t: $bw Gbit/s, $retr retransmits"
      res[$m-$t]+="$bw "
    done
    [[ $m == fastpath ]] && "$bin" status 2>/dev/null | awk -v h="prg-$name-h1" '/^fastpath on / {on = ($3 == h ":")} on && /fastpath (egress|ingress)/ {print "    client node:" $0}'
    [[ $m == fastpath ]] && "$bin" detach --lab --name "$name" >/dev/null
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for k in vanilla-svc vanilla-pod fastpath-svc fastpath-pod; do
  declare "m_${k/-/_}=$(median <<<"${res[$k]}")"
done
echo "medians (Gbit/s, $reps reps x ${secs}s, kube-proxy $mode mode):"
echo "  vanilla  ClusterIP $m_vanilla_svc   pod $m_vanilla_pod"
echo "  fastpath ClusterIP $m_fastpath_svc   pod $m_fastpath_pod"
awk -v a="$m_fastpath_svc" -v b="$m_vanilla_svc" -v c="$m_fastpath_pod" -v d="$m_vanilla_pod" 'BEGIN {
  printf "  fastpath/vanilla via ClusterIP %.2fx; fastpath ClusterIP/pod %.2fx; fastpath/vanilla to the pod %.2fx\n", a/b, a/c, c/d }'
