#!/usr/bin/env bash
# device-bench.sh: the many-core experiments in one short run, for the `device` tool's 16-core machine
# (or any root Linux box). Everything it needs travels with it: the static peregrine and the workload
# tools come from .devpack/pack.tar.gz (scripts/device-pack.sh), unpacked into a temporary folder.
#
# Steps, in priority order (the budget skips what no longer fits, saying so):
#   preflight   root, network namespaces (veth, bridge, vxlan), bpffs, tracefs, BTF, tcx, bpf_redirect_peer,
#               CPU count: anything missing stops the run within seconds, naming it
#   one TCP flow (64 KB) and UDP 64 B injected, each at every CPU count N (1 2 4 8 16, at most the
#               machine's), configs flannel (vanilla), rps, falcon, mflow, fastpath, falcon+fastpath side
#               by side (native too at the largest N). N CPUs = the modes' CPUs 0..N-1 (bench --mode-cpus),
#               the IRQ core CPU0, the receiving application CPU N-1; the sender (the remote host) on the
#               machine's last CPU
#   prism       HP ping-pong p99 under a bulk TCP background, vanilla vs prism vs prism with threaded
#               underlay NAPI (napi_threaded: 7.5x worse on 2 vCPUs; does a core of its own change that?), largest N
#   handoff     UDP 64 B, the cpumap hand-off (GRO on the remote CPU, Linux 6.15+) against RPS's, at the
#               largest N: falcon vs falcon@split_cpus (cpumap NIC stage), mflow device (RPS) vs full-path
#   nginx       4 workers (--app-cpus 1-4 where the machine has 6+ CPUs, else one), native, flannel,
#               fastpath, falcon
#   model       `peregrine bench project --against`: the model's prediction at every N from the N=2 run's
#               stage costs, next to what each N measured, with the error
#   report      the HTML report of every run
# Output in $OUT (the device tool's; default ./device-out): device-bench.log (progress and every table),
# summary.json (machine, preflight, steps, model rows), model.txt, results.tar.gz (every result JSON and
# the HTML reports). At most 8 files, as the device tool brings back.
#
# Usage: scripts/device-bench.sh [--cpus N] [--ns 1,2,4,8,16] [--duration S] [--reps R] [--budget S]
#                                [--peregrine PATH] [--out DIR] [--preflight-only]
#   --cpus N      use at most N CPUs (default: all online)     --ns       the CPU counts to measure at
#   --duration S  seconds per measurement (default 2)           --reps     repetitions (default 2; 1 where
#   --budget S    the whole run's time (default 450 s): steps that would not fit are skipped, each step is
#                 killed at what is left; `peregrine bench` cleans up after an interrupt
#                 the estimate does not fit the budget)
#   --peregrine   a peregrine binary to use instead of the pack's (the tools then come from the pack, or
#                 from PATH where there is no pack)
# The device tool (see docs/bench.md, "The device run"):
#   run  command: scripts/device-bench.sh   carry: [".devpack"]   timeout_s: 540
# Smoke test here (scripts/test.sh runs it through internal/bench's TestDeviceBenchSmoke):
#   scripts/device-bench.sh --cpus 2 --ns 2 --duration 1 --reps 1 --budget 180
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CPUS=$(nproc)
NS_LIST="1,2,4,8,16"
DUR=2
REPS=2
BUDGET=450
PRG=""
OUTDIR=${OUT:-$ROOT/device-out}
PREFLIGHT_ONLY=0
usage() { sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
	case "$1" in
	--cpus) CPUS=$2; shift 2 ;;
	--ns) NS_LIST=$2; shift 2 ;;
	--duration) DUR=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--budget) BUDGET=$2; shift 2 ;;
	--peregrine) PRG=$2; shift 2 ;;
	--out) OUTDIR=$2; shift 2 ;;
	--preflight-only) PREFLIGHT_ONLY=1; shift ;;
	-h|--help) usage; exit 0 ;;
	*) echo "device-bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
isint() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
ONLINE=$(nproc)
isint "$CPUS" 1 4096 || { echo "device-bench: --cpus $CPUS: want a CPU count, 1..$ONLINE" >&2; exit 2; }
[ "$CPUS" -le "$ONLINE" ] || { echo "device-bench: --cpus $CPUS: this machine has $ONLINE online CPUs" >&2; exit 2; }
isint "$DUR" 1 60 || { echo "device-bench: --duration $DUR: want whole seconds, 1..60" >&2; exit 2; }
isint "$REPS" 1 10 || { echo "device-bench: --reps $REPS: want 1..10" >&2; exit 2; }
isint "$BUDGET" 30 3600 || { echo "device-bench: --budget $BUDGET: want seconds, 30..3600" >&2; exit 2; }
NS=()
for n in ${NS_LIST//,/ }; do
	isint "$n" 1 4096 || { echo "device-bench: --ns $NS_LIST: '$n' is not a CPU count" >&2; exit 2; }
	[ "$n" -le "$CPUS" ] && NS+=("$n")
done
[ ${#NS[@]} -gt 0 ] || { echo "device-bench: --ns $NS_LIST: none is at most --cpus $CPUS" >&2; exit 2; }
NMAX=${NS[-1]}
for n in "${NS[@]}"; do [ "$n" -gt "$NMAX" ] && NMAX=$n; done

START=$(date +%s)
mkdir -p "$OUTDIR" || { echo "device-bench: cannot create $OUTDIR" >&2; exit 2; }
LOG=$OUTDIR/device-bench.log
: >"$LOG"
WORK=$(mktemp -d /tmp/prg-devbench.XXXXXX)
RES=$WORK/results
mkdir -p "$RES"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
trap 'echo "device-bench: interrupted" >&2; exit 130' INT TERM

el() { echo $(( $(date +%s) - START )); }
say() { printf '[device-bench %3ss] %s\n' "$(el)" "$*" | tee -a "$LOG" >&2; }
STEPS_JSON=()
step_json() { STEPS_JSON+=("{\"step\":\"$1\",\"status\":\"$2\",\"seconds\":$3,\"note\":\"${4//\"/\'}\"}"); }

# --- the tools ------------------------------------------------------------------------------------
PACK=$ROOT/.devpack/pack.tar.gz
if [ -f "$PACK" ]; then
	mkdir -p "$WORK/pack"
	tar -C "$WORK/pack" -xzf "$PACK" || { say "FAIL: cannot unpack $PACK"; exit 1; }
	export PATH=$WORK/pack/bin:$PATH
	[ -n "$PRG" ] || PRG=$WORK/pack/peregrine
	say "tools from $PACK ($(du -k "$PACK" | cut -f1) KiB), unpacked into $WORK/pack"
fi
if [ -z "$PRG" ]; then
	if [ -x "$ROOT/bin/peregrine" ]; then PRG=$ROOT/bin/peregrine
	else
		say "FAIL: no peregrine: no $PACK (scripts/device-pack.sh builds it) and no bin/peregrine (make build); or give --peregrine PATH"
		exit 1
	fi
fi
[ -x "$PRG" ] || { say "FAIL: $PRG is not an executable"; exit 1; }

# --- preflight: seconds, and it says what is missing ----------------------------------------------
MISSING=()
miss() { MISSING+=("$1"); say "preflight: MISSING $1"; }
[ "$(id -u)" = 0 ] || miss "root (network namespaces, BPF): run as root"
[ "$(uname -m)" = x86_64 ] || miss "x86-64 (the pack is x86-64; this is $(uname -m))"
for t in ip tc ethtool nft iperf3 sockperf wrk nginx taskset chrt ping; do
	command -v "$t" >/dev/null 2>&1 || miss "tool $t (not in the pack nor on PATH: scripts/device-pack.sh)"
done
mountpoint -q /sys/fs/bpf 2>/dev/null || { mount -t bpf bpf /sys/fs/bpf 2>/dev/null && say "preflight: mounted bpffs on /sys/fs/bpf"; }
[ -d /sys/kernel/tracing/events ] || { mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null && say "preflight: mounted tracefs on /sys/kernel/tracing"; }
DOCTOR=$(timeout 20 "$PRG" doctor --json 2>/dev/null)
for c in privileges bpffs btf tracefs tcx redirect_peer; do
	st=$(printf '%s' "$DOCTOR" | tr -d '\n' | grep -o "\"name\": *\"$c\", *\"status\": *\"[a-z]*\"" | sed 's/.*"\([a-z]*\)"$/\1/')
	[ "$st" = ok ] || miss "kernel feature $c (peregrine doctor: ${st:-no answer})"
done
PF_NS=prg-pf-$$
if timeout 10 ip netns add "$PF_NS" 2>/dev/null; then
	for kind in "veth peer name prg-pf-b" "bridge" "vxlan id 42 dstport 4789"; do
		timeout 5 ip -n "$PF_NS" link add prg-pf-a type $kind 2>/dev/null || miss "network device type ${kind%% *} (CONFIG_${kind%% *}; modules cannot be loaded)"
		ip -n "$PF_NS" link del prg-pf-a 2>/dev/null
	done
	ip netns del "$PF_NS"
else
	miss "network namespaces (ip netns add failed)"
fi
[ "$CPUS" -ge 2 ] || miss "at least 2 CPUs (the sender needs one apart from the receiver's IRQ core)"
say "preflight: kernel $(uname -r), $ONLINE CPUs online (using $CPUS), CPU counts ${NS[*]}, duration ${DUR}s, reps $REPS, budget ${BUDGET}s"
if [ ${#MISSING[@]} -gt 0 ]; then
	say "preflight FAILED after $(el)s: ${#MISSING[@]} missing; nothing was measured"
	printf '{"preflight":"failed","missing":[%s]}\n' "$(printf '"%s",' "${MISSING[@]}" | sed 's/,$//')" >"$OUTDIR/summary.json"
	exit 1
fi
say "preflight ok"
[ "$PREFLIGHT_ONLY" = 1 ] && { printf '{"preflight":"ok"}\n' >"$OUTDIR/summary.json"; exit 0; }

# --- the plan -------------------------------------------------------------------------------------
LAST=$((ONLINE - 1))
[ "$CPUS" -lt "$ONLINE" ] && LAST=$((CPUS - 1))
CONFIGS="flannel,flannel/rps,flannel/falcon,flannel/mflow,flannel/fastpath,flannel/falcon/fastpath"
STEPS=() # "name|est_seconds|reps|command..."
cpulist() { [ "$1" = 1 ] && echo 0 || echo "0-$(($1 - 1))"; } # CPUs 0..N-1
# est: per config a lab (~2 s) and per rep the measurement plus ~1.5 s of sampling and teardown.
est() { echo $(( $1 * (2 + $2 * (DUR + 2)) )); }
plan() {
	local reps=$1 n args cfgs ncfg
	STEPS=()
	add_n() { # N scenario size
		n=$1
		cfgs=$CONFIGS
		[ "$n" = "$NMAX" ] && cfgs="native,$cfgs"
		ncfg=$(echo "$cfgs" | tr ',' '\n' | wc -l)
		args="--configs $cfgs --flows 1 --sizes $3 --rx-cpus 0 --app-cpus $((n > 1 ? n - 1 : 0)) --sender-cpus $LAST --mode-cpus $(cpulist "$n")"
		STEPS+=("$2-n$n|$(est "$ncfg" "$reps")|$n|bench run $2 $args")
	}
	# Priority: the targets (largest N), the model's base (N=2), the latency and web steps, the rest.
	add_n "$NMAX" tcp 65536; add_n "$NMAX" udp-inject 64
	for n in "${NS[@]}"; do [ "$n" = 2 ] && [ "$NMAX" != 2 ] && { add_n 2 tcp 65536; add_n 2 udp-inject 64; }; done
	STEPS+=("prism-n$NMAX|$(est 3 "$reps")|$NMAX|bench run pingpong --configs flannel,flannel/prism,flannel/prism@napi_threaded=true --background tcp --hp-rt --rx-cpus 0 --app-cpus $((NMAX > 1 ? NMAX - 1 : 0)) --sender-cpus $LAST --mode-cpus $(cpulist "$NMAX")")
	# Hand-off mechanism, side by side: falcon's RPS hand-offs vs the same plus a cpumap split of the
	# NIC stage (GRO on the remote CPU since Linux 6.15), mflow's RPS (device) vs cpumap (full-path) split.
	# Its results go to their own folder (n<N>-handoff): the model reads only the main steps.
	local sc=1
	[ "$NMAX" -gt 2 ] && sc=$((NMAX - 2))
	STEPS+=("handoff-n$NMAX|$(est 4 "$reps")|$NMAX-handoff|bench run udp-inject --configs flannel/falcon,flannel/falcon@split_cpus=$sc,flannel/mflow@split_at=device,flannel/mflow --flows 1 --sizes 64 --rx-cpus 0 --app-cpus $((NMAX > 1 ? NMAX - 1 : 0)) --sender-cpus $LAST --mode-cpus $(cpulist "$NMAX")")
	local app=1
	[ "$ONLINE" -ge 6 ] && [ "$CPUS" -ge 6 ] && app=1-4
	STEPS+=("nginx-n$NMAX|$(est 4 "$reps")|$NMAX|bench run nginx --configs native,flannel,flannel/fastpath,flannel/falcon --rx-cpus 0 --app-cpus $app --sender-cpus $LAST --mode-cpus $(cpulist "$NMAX")")
	for n in "${NS[@]}"; do
		[ "$n" = "$NMAX" ] && continue
		[ "$n" = 2 ] && continue
		add_n "$n" tcp 65536; add_n "$n" udp-inject 64
	done
}
total_est() { local t=0 s; for s in "${STEPS[@]}"; do t=$((t + $(echo "$s" | cut -d'|' -f2))); done; echo $t; }
plan "$REPS"
if [ "$(total_est)" -gt $((BUDGET - 30)) ] && [ "$REPS" -gt 1 ]; then
	say "plan: ~$(total_est)s at $REPS reps exceeds the budget; 1 rep each"
	REPS=1; plan 1
fi
say "plan: ${#STEPS[@]} steps, ~$(total_est)s estimated of ${BUDGET}s"

# --- the steps ------------------------------------------------------------------------------------
i=0
for s in "${STEPS[@]}"; do
	i=$((i + 1))
	IFS='|' read -r name estS n cmd <<<"$s"
	left=$((BUDGET - $(el) - 20)) # 20 s kept for the model, the report and the archive
	if [ "$left" -lt $((estS * 2 / 3)) ]; then
		say "step $i/${#STEPS[@]} $name SKIPPED: ~${estS}s estimated, ${left}s left in the budget"
		step_json "$name" skipped 0 "budget: ${left}s left of ${BUDGET}s, ~${estS}s estimated"
		continue
	fi
	mkdir -p "$RES/n$n"
	say "step $i/${#STEPS[@]} $name (~${estS}s, limit ${left}s): peregrine $cmd"
	t0=$(date +%s)
	# shellcheck disable=SC2086
	timeout -s INT -k 15 "$left" "$PRG" $cmd --duration "${DUR}s" --reps "$REPS" --warmup 0 --out "$RES/n$n" --no-report >>"$LOG" 2>&1
	rc=$?
	dt=$(( $(date +%s) - t0 ))
	case $rc in
	0) say "step $name done in ${dt}s"; step_json "$name" ok "$dt" "" ;;
	124|137) say "step $name KILLED at the budget after ${dt}s (partial result kept)"; step_json "$name" timeout "$dt" "killed at the budget" ;;
	*) say "step $name FAILED (exit $rc) after ${dt}s: see device-bench.log"; step_json "$name" failed "$dt" "exit $rc" ;;
	esac
done

# --- the model against the machine ----------------------------------------------------------------
BASE_N=2
[ -d "$RES/n2" ] || BASE_N=${NS[0]}
MODEL_ROWS="[]"
if ls "$RES/n$BASE_N"/*.json >/dev/null 2>&1; then
	against=()
	for n in "${NS[@]}"; do ls "$RES/n$n"/*.json >/dev/null 2>&1 && against+=(--against "$n=$RES/n$n"); done
	say "model: stage costs of the N=$BASE_N runs, predicted at N = ${NS[*]}, against what each measured"
	"$PRG" bench project "$RES/n$BASE_N" "${against[@]}" >"$OUTDIR/model.txt" 2>>"$LOG" || say "model: bench project failed (see the log)"
	"$PRG" bench project "$RES/n$BASE_N" "${against[@]}" --json >"$WORK/model.json" 2>>"$LOG" && MODEL_ROWS=$(cat "$WORK/model.json")
	cat "$OUTDIR/model.txt" >>"$LOG"
else
	say "model: no N=$BASE_N result to take stage costs from"
fi

# --- the report and the archive -------------------------------------------------------------------
for d in "$RES"/n*; do
	ls "$d"/*.json >/dev/null 2>&1 || continue
	"$PRG" report "$d" --out "$d/html" >>"$LOG" 2>&1 || say "report of $d failed (see the log)"
done
tar -C "$WORK" -czf "$OUTDIR/results.tar.gz" results 2>>"$LOG"
{
	printf '{\n  "machine": {"kernel": "%s", "cpus_online": %s, "cpus_used": %s, "model": "%s"},\n' \
		"$(uname -r)" "$ONLINE" "$CPUS" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //; s/"//g')"
	printf '  "settings": {"cpu_counts": [%s], "duration_s": %s, "reps": %s, "budget_s": %s},\n' "$(IFS=,; echo "${NS[*]}")" "$DUR" "$REPS" "$BUDGET"
	printf '  "pack_kib": %s,\n' "$( [ -f "$PACK" ] && du -k "$PACK" | cut -f1 || echo null)"
	printf '  "preflight": "ok",\n  "steps": [%s],\n' "$(IFS=,; echo "${STEPS_JSON[*]}")"
	printf '  "model_base_cpus": %s,\n  "model": %s,\n' "$BASE_N" "$MODEL_ROWS"
	printf '  "seconds": %s\n}\n' "$(el)"
} >"$OUTDIR/summary.json"
failed=$(printf '%s\n' "${STEPS_JSON[@]}" | grep -c '"status":"failed"')
say "done in $(el)s: ${#STEPS_JSON[@]} steps, $failed failed; $OUTDIR: $(cd "$OUTDIR" && ls | tr '\n' ' ')"
[ "$failed" = 0 ]
