#!/bin/bash
# One TCP flow between busybox containers on the two nodes of the real docker swarm lab
# (scripts/real-docker-overlay.sh), over the user overlay (VNI 4097): vanilla vs fastpath,
# interleaved reps after a discarded warm-up, medians. busybox has no iperf3: the host's runs in
# each container's network namespace (nsenter --net=<docker inspect's SandboxKey>). Each rep
# reports the rate, the sender's retransmits, the receiver's out-of-order queueings
# (TcpExtTCPOFOQueue) and the receiving node's underlay drops; fastpath reps also the fast path's
# counters as `peregrine status` shows them (per overlay: VNI, hits, misses).
# Brings the lab up and takes it down (also on failure). Run under the integration lock:
#   flock /tmp/prg-integration.lock scripts/real-docker-overlay-bench.sh [REPS] [SECS]
# PEREGRINE: the binary (default: go build into a temporary directory). As the other benchmarks
# arrange it (docs/results.md): each node's underlay receive runs on CPU0 (RPS, the emulated NIC's
# IRQ core), both iperf3 ends on CPU1; PRG_SWB_PIN=0 leaves placement to the scheduler.
set -euo pipefail
reps=${1:-5}
secs=${2:-5}
[[ $reps =~ ^[1-9][0-9]?$ && $secs =~ ^[1-9][0-9]?$ ]] || { echo "usage: $0 [REPS 1-99] [SECS 1-99]" >&2; exit 2; }
cd "$(dirname "$0")/.."
name=swb
lab=scripts/real-docker-overlay.sh
tmp=$(mktemp -d /tmp/prg-swb.XXXXXX)
pg=${PEREGRINE:-}
if [[ -z $pg ]]; then
	go build -o "$tmp/peregrine" ./cmd/peregrine
	pg=$tmp/peregrine
fi
nodes=(prg-$name-n1 prg-$name-n2)
cleanup() {
	for n in "${nodes[@]}"; do "$pg" detach --netns "$n" >/dev/null 2>&1 || true; done
	"$lab" down "$name"
	rm -rf "$tmp"
}
trap cleanup EXIT
"$lab" up "$name" >"$tmp/info"
cat "$tmp/info" >&2
get() { awk -F= -v k="$1" '$1 == k {print $2}' "$tmp/info"; }
c1=$(get N1_C1_NETNS) c2=$(get N2_C1_NETNS) dst=$(get N2_C1_IP)
pin=()
if [[ ${PRG_SWB_PIN:-1} != 0 ]]; then
	pin=(taskset -c 1)
	for n in "${nodes[@]}"; do  # ip netns exec: its /sys is the node's
		ip netns exec "$n" sh -c 'echo 1 >/sys/class/net/eth0/queues/rx-0/rps_cpus'
	done
fi
inc1() { nsenter --net="$c1" -- "${pin[@]}" "$@"; }
inc2() { nsenter --net="$c2" -- "${pin[@]}" "$@"; }
rxdrop() { ip -n "${nodes[1]}" -s -j link show eth0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["dropped"])'; }

# The receiver's out-of-order queueings, absolute (nstat's history file is shared by namespaces).
ofo() { inc2 nstat -az TcpExtTCPOFOQueue | awk '/TcpExtTCPOFOQueue/{print $2}'; }

one() { # one transfer; prints "gbps retransmits ofo underlay_drops"
	local d0 o0 port=5311
	o0=$(ofo)
	d0=$(rxdrop)
	inc2 iperf3 -s -1 -D -p $port
	for _ in $(seq 50); do inc2 ss -Htln | grep -q ":$port " && break; sleep 0.05; done
	inc1 iperf3 -c "$dst" -p $port -t "$secs" -J >"$tmp/run.json"
	python3 - "$tmp/run.json" "$(($(ofo) - o0))" "$(($(rxdrop) - d0))" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["end"]
print("%.2f %d %s %s" % (r["sum_received"]["bits_per_second"] / 1e9, r["sum_sent"]["retransmits"], sys.argv[2], sys.argv[3]))
EOF
}

hits() { # the fast path's counters as status prints them (per overlay: VNI, hits, misses)
	"$pg" status | grep -iE 'vni|hit|fastpath on' || true
}

echo "placement: ${pin[*]:-the scheduler}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
one >/dev/null   # warm-up, discarded
printf '%-9s %3s %8s %8s %8s %8s\n' mode rep Gbps retrans ofo rxdrop
for r in $(seq "$reps"); do
	echo "vanilla $r $(one)" >>"$tmp/results"
	tail -1 "$tmp/results" | awk '{printf "%-9s %3s %8s %8s %8s %8s\n", $1, $2, $3, $4, $5, $6}'
	for n in "${nodes[@]}"; do "$pg" attach fastpath --netns "$n" >/dev/null; done
	inc1 ping -c 3 -i 0.2 -q "$dst" >/dev/null   # learn before measuring
	echo "fastpath $r $(one)" >>"$tmp/results"
	tail -1 "$tmp/results" | awk '{printf "%-9s %3s %8s %8s %8s %8s\n", $1, $2, $3, $4, $5, $6}'
	hits | sed 's/^/          /'
	for n in "${nodes[@]}"; do "$pg" detach --netns "$n" >/dev/null; done
done
python3 - "$tmp/results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {m: [statistics.median(float(r[i]) for r in rows if r[0] == m) for i in (2, 3, 4, 5)] for m in ("vanilla", "fastpath")}
for m, (g, rt, ofo, dr) in med.items():
    print("median %-8s %.2f Gbps, %d retransmits, %d ofo, %d underlay drops" % (m, g, rt, ofo, dr))
print("fastpath/vanilla %.2fx" % (med["fastpath"][0] / med["vanilla"][0]))
EOF
