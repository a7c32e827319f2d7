#!/bin/bash
# One TCP flow pod n1-p1 -> pod n2-p1 across the hand-built Calico VXLAN layout
# (scripts/handbuilt-calico.sh: vxlan.calico VNI 4096, pods on unbridged cali* veths, /32 routes,
# proxy ARP): vanilla vs fastpath, interleaved reps after a discarded warm-up, medians. Each rep is
# one `peregrine bench run tcp` between the two pods' namespaces (iperf3, --reps 1); the fast path
# is attached to both nodes before its rep (and learned by 3 pings) and detached after, so the
# two configs alternate on one lab. Fastpath reps also print the sending node's hit counters.
# The underlay is made NIC-like as peregrine's own lab makes its eth0 (internal/lab: GRO, WireFrames,
# RxCPUs): GRO on (veth NAPI mode), transmit checksum offload and with it TSO off (MTU-sized frames
# with complete checksums on the "wire", as a real link carries), receive steered to CPU 0 by RPS
# (the emulated NIC's IRQ core), a pfifo_fast qdisc (a veth with a qdisc stops its queue when the
# peer's ring is full instead of dropping); PRG_CB_NICLIKE=0 leaves the script's plain veth pair.
# `peregrine bench compare tcp --style calico --modes vanilla,fastpath` builds the same layout in the
# bench itself, with a native baseline, the stage probe and BPF statistics (docs/results.md).
# Brings the lab up and takes it down (also on failure). Run under the shared lock:
#   flock -o /tmp/prg-heavy.lock scripts/calico-bench.sh [REPS] [SECS]
# PEREGRINE: the binary (default: go build into a temporary directory).
set -euo pipefail
reps=${1:-5}
secs=${2:-5}
[[ $reps =~ ^[1-9][0-9]?$ && $secs =~ ^[1-9][0-9]?$ ]] || { echo "usage: $0 [REPS 1-99] [SECS 1-99]" >&2; exit 2; }
cd "$(dirname "$0")/.."
name=cb
lab=scripts/handbuilt-calico.sh
tmp=$(mktemp -d /tmp/prg-cb.XXXXXX)
pg=${PEREGRINE:-}
if [[ -z $pg ]]; then
	go build -o "$tmp/peregrine" ./cmd/peregrine
	pg=$tmp/peregrine
fi
nodes=(prg-$name-n1 prg-$name-n2)
cli=prg-$name-n1-p1 srv=prg-$name-n2-p1 dst=10.65.2.2
cleanup() {
	for n in "${nodes[@]}"; do "$pg" detach --netns "$n" >/dev/null 2>&1 || true; done
	"$lab" down "$name"
	rm -rf "$tmp"
}
trap cleanup EXIT
"$lab" up "$name" 1
if [[ ${PRG_CB_NICLIKE:-1} != 0 ]]; then
	for n in "${nodes[@]}"; do
		ip netns exec "$n" ethtool -K eth0 gro on tx off >/dev/null
		ip netns exec "$n" tc qdisc replace dev eth0 root pfifo_fast
		ip netns exec "$n" sh -c 'echo 1 >/sys/class/net/eth0/queues/rx-0/rps_cpus'
	done
fi

one() { # one transfer; prints "gbps retransmits cpu_ns_per_packet"
	rm -rf "$tmp/out"
	"$pg" bench run tcp --server-ns "$srv" --server-addr "$dst" --client-ns "$cli" --reps 1 --warmup 0 \
		--duration "${secs}s" --json --no-report --out "$tmp/out" >"$tmp/run.json" 2>"$tmp/run.err" ||
		{ cat "$tmp/run.err" >&2; return 1; }
	python3 - "$tmp/run.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["points"][0]["reps"][0]["metrics"]
print("%.2f %d %.0f" % (m["throughput_bps"] / 1e9, m.get("retransmits_count", 0), m.get("cost_cpu_ns", 0)))
EOF
}

hits() { # the fast path's counters as status prints them
	"$pg" status | grep -E 'fastpath (egress|ingress)' || true
}

echo "underlay: ${PRG_CB_NICLIKE:-1} (1: GRO on, tx checksums/TSO off, RPS to CPU 0, pfifo_fast); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
one >/dev/null # warm-up, discarded
printf '%-9s %3s %8s %8s %12s\n' mode rep Gbps retrans cpu_ns/pkt
: >"$tmp/results"
for r in $(seq "$reps"); do
	echo "vanilla $r $(one)" >>"$tmp/results"
	tail -1 "$tmp/results" | awk '{printf "%-9s %3s %8s %8s %12s\n", $1, $2, $3, $4, $5}'
	for n in "${nodes[@]}"; do "$pg" attach fastpath --netns "$n" >/dev/null; done
	ip netns exec "$cli" ping -c 3 -i 0.2 -q "$dst" >/dev/null # learn before measuring
	echo "fastpath $r $(one)" >>"$tmp/results"
	tail -1 "$tmp/results" | awk '{printf "%-9s %3s %8s %8s %12s\n", $1, $2, $3, $4, $5}'
	hits | sed 's/^/          /'
	for n in "${nodes[@]}"; do "$pg" detach --netns "$n" >/dev/null; done
done
python3 - "$tmp/results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
col = lambda m, i: [float(r[i]) for r in rows if r[0] == m]
for m in ("vanilla", "fastpath"):
    g = col(m, 2)
    print("median %-8s %.2f Gbit/s [%.2f-%.2f], %d retransmits, %.0f ns CPU per packet" % (
        m, statistics.median(g), min(g), max(g), statistics.median(col(m, 3)), statistics.median(col(m, 4))))
ratios = [f / v for v, f in zip(col("vanilla", 2), col("fastpath", 2))]
print("fastpath/vanilla per rep: %s; median %.2fx" % (", ".join("%.2f" % r for r in ratios), statistics.median(ratios)))
EOF
