#!/usr/bin/env bash
# upgrade-check.sh [OLD_COMMIT]: upgrade a live fastpath attachment from an older peregrine to
# this tree's, on a flannel-style lab, with a TCP stream running across the upgrade, and check
# what docs/agent.md ("Restarts, upgrades, uninstall") promises:
#   - the stream never stalls (no 100 ms interval without bytes) and never resets;
#   - every pinned tcx link keeps its id (the new programs were swapped in with a link update);
#   - the programs whose code changed (kernel tag) were replaced in the links, the others kept;
#   - the maps the new binary added (repair.go's laterMaps) are pinned beside the old ones;
#   - the flow table is the same map and kept its entries; fast-path hits continue;
#   - the agent logged an in-place upgrade, not a detach and attach;
#   - the new binary's `peregrine status` reads the old attachment before the upgrade, and is
#     sane after it; detach with the new binary leaves no pin, record or link, and `lab down` no
#     prg-<lab> namespace. (`peregrine uninstall` is not run: it removes every attachment on the
#     machine, other labs' included; detach removes the same pieces of these two.)
#
# It builds OLD_COMMIT (default fe2a938: before prg_fastpath_hob, prg_fastpath_stat2 and the IPv6
# underlay's maps) in a scratch git worktree and this tree's binary, unless PRG_UPG_OLD_BIN /
# PRG_UPG_NEW_BIN name prebuilt ones. Needs root, iperf3, bpftool, jq, curl.
# Environment: PRG_UPG_NAME (lab name, default upg), PRG_UPG_SECONDS (stream length, default 20),
# PRG_UPG_SWAP_AT (seconds into the stream the upgrade starts, default 6), PRG_UPG_RATE (iperf3 -b,
# default 1G: leaves CPU to the agents so a dip is the datapath's, not CPU contention; 0 = no cap),
# PRG_UPG_KEEP=1 (keep the work directory with logs and JSON), PRG_UPG_IPV6_UNDERLAY=1 (the lab is
# real flannel's dual stack, --ipv6 --ipv6-underlay, and the stream runs between the pods' IPv6
# addresses over flannel-v6.1: a binary before the IPv6 underlay leaves it to the normal path,
# the upgraded programs must take it onto the fast path, mid-stream, without a stall).
# On a shared machine give it the heavy-work lock, taken after the builds (its children never hold
# it): sudo PRG_UPG_LOCK=/tmp/prg-heavy.lock scripts/upgrade-check.sh
# Not part of scripts/test.sh: building an older tree takes minutes.
set -euo pipefail

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
	sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"
	exit 0
fi
[[ $# -le 1 ]] || { echo "usage: $0 [OLD_COMMIT] (see --help)" >&2; exit 2; }
OLD_COMMIT=${1:-fe2a938}
NAME=${PRG_UPG_NAME:-upg}
SECS=${PRG_UPG_SECONDS:-20}
SWAP_AT=${PRG_UPG_SWAP_AT:-6}
RATE=${PRG_UPG_RATE:-1G}
V6=${PRG_UPG_IPV6_UNDERLAY:-0}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PINS=/sys/fs/bpf/peregrine
HOSTS=(prg-$NAME-h1 prg-$NAME-h2)
C1=prg-$NAME-h1-c1
C2=prg-$NAME-h2-c1

die() { echo "upgrade-check: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "must run as root (it builds a lab and loads eBPF): sudo $0 $*"
[[ $NAME =~ ^[a-z0-9]{1,8}$ ]] || die "PRG_UPG_NAME must be 1-8 lowercase letters or digits, got '$NAME'"
[[ $SECS =~ ^[0-9]+$ && $SWAP_AT =~ ^[0-9]+$ && $SECS -ge $((SWAP_AT + 8)) ]] ||
	die "PRG_UPG_SECONDS must be at least PRG_UPG_SWAP_AT + 8 (got $SECS and $SWAP_AT)"
for tool in iperf3 bpftool jq curl git go ip; do
	command -v $tool >/dev/null || die "$tool not found (scripts/setup.sh installs it)"
done
if ip netns list | grep -q "^prg-$NAME-"; then
	die "namespaces prg-$NAME-* exist: a lab named '$NAME' is up (remove it: peregrine lab down --name $NAME, or set PRG_UPG_NAME)"
fi
if [[ -e /run/peregrine/labs/$NAME.json ]]; then
	die "a lab named '$NAME' is on record (peregrine lab down --name $NAME, or set PRG_UPG_NAME)"
fi

WORK=$(mktemp -d /tmp/prg-upgcheck.XXXXXX)
SCRATCH=""
PIDS=()
FAILS=0
NEW=${PRG_UPG_NEW_BIN:-$WORK/new/peregrine}
OLD=${PRG_UPG_OLD_BIN:-$WORK/old/peregrine}

cleanup() {
	local rc=$?
	set +e
	for pid in "${PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null
	done
	for pid in "${PIDS[@]}"; do
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null
	done
	if [[ -x $NEW ]] && ip netns list | grep -q "^prg-$NAME-"; then
		"$NEW" detach --lab --name "$NAME" --force >>"$WORK/cleanup.log" 2>&1
		"$NEW" lab down --name "$NAME" >>"$WORK/cleanup.log" 2>&1
	fi
	for h in "${HOSTS[@]}"; do
		rm -rf "${PINS:?}/$h" "/run/peregrine/agent/$h.json" "/run/peregrine/agents/fastpath-agent-$h.log" \
			/run/peregrine/datapath/"$h".*.json 2>/dev/null
	done
	if [[ -n $SCRATCH ]]; then
		git -C "$REPO" worktree remove --force "$SCRATCH" 2>/dev/null || rm -rf "$SCRATCH"
	fi
	if [[ ${PRG_UPG_KEEP:-0} == 1 ]]; then
		echo "upgrade-check: work directory kept: $WORK"
	else
		rm -rf "$WORK"
	fi
	exit $rc
}
trap cleanup EXIT
# A command that fails outside a check ends the run: say which, so it never passes silently.
trap 'echo "FAIL upgrade-check.sh line $LINENO: $BASH_COMMAND exited non-zero" >&2' ERR
trap 'exit 130' INT TERM

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
check() { # check COND-EXIT-STATUS MESSAGE
	if [[ $1 -eq 0 ]]; then pass "$2"; else fail "$2"; fi
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# --- binaries -------------------------------------------------------------------------------------
if [[ -z ${PRG_UPG_NEW_BIN:-} ]]; then
	echo "building this tree ($(git -C "$REPO" rev-parse --short HEAD)) ..."
	(cd "$REPO" && CGO_ENABLED=0 go build -o "$NEW" ./cmd/peregrine)
fi
if [[ -z ${PRG_UPG_OLD_BIN:-} ]]; then
	git -C "$REPO" rev-parse --verify -q "$OLD_COMMIT^{commit}" >/dev/null || die "no commit $OLD_COMMIT in $REPO"
	SCRATCH=$WORK/old-tree
	echo "building $OLD_COMMIT in a scratch worktree ..."
	git -C "$REPO" worktree add --detach "$SCRATCH" "$OLD_COMMIT" >/dev/null 2>&1
	(cd "$SCRATCH" && CGO_ENABLED=0 go build -o "$OLD" ./cmd/peregrine)
fi
[[ -x $OLD && -x $NEW ]] || die "binaries missing: $OLD $NEW"
if [[ -n ${PRG_UPG_LOCK:-} ]]; then
	exec 9>>"$PRG_UPG_LOCK"
	echo "waiting for the lock $PRG_UPG_LOCK ..."
	flock 9
	if ip netns list | grep -q "^prg-$NAME-"; then # made while this run waited
		die "namespaces prg-$NAME-* exist: a lab named '$NAME' is up"
	fi
fi

# --- helpers ----------------------------------------------------------------------------------------
free_port() {
	local p
	for _ in $(seq 50); do
		p=$((20000 + RANDOM % 20000))
		ss -Htln "sport = :$p" | grep -q . || { echo "$p"; return; }
	done
	die "no free port"
}
declare -A PORT AGENT NOTED
start_agent() { # start_agent BIN HOST TAG
	local cfg=$WORK/$2.yaml
	setsid "$1" agent --config "$cfg" --netns "$2" >"$WORK/agent-$3-$2.log" 2>&1 </dev/null 9>&- &
	AGENT[$2]=$!
	PIDS+=("$!")
}
# wait_ready HOST SECONDS: /readyz says ready. On the IPv6 underlay's lab an older binary's
# start-up checks fail (its doctor's mtu: flannel-v6.1's MTU is 20 below the pods'; a note since
# 2026-11-29), so there the agent counts as ready once its only reason is those checks (no
# mode's reason, first reconcile done).
wait_ready() {
	local i code body
	for ((i = 0; i < $2 * 20; i++)); do
		body=$(curl -s -w '\n%{http_code}' "http://127.0.0.1:${PORT[$1]}/readyz" || true)
		code=${body##*$'\n'}
		[[ $code == 200 ]] && return 0
		if [[ $V6 == 1 && $code == 503 && $body == "not ready: start-up checks:"* && $body != *"fastpath:"* &&
			$body != *"first reconcile"* && $body != *"config refused"* ]]; then
			[[ -n ${NOTED[$1]:-} ]] || echo "NOTE $1: ready but for the start-up checks: $(head -1 <<<"$body")"
			NOTED[$1]=1
			return 0
		fi
		kill -0 "${AGENT[$1]}" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
stop_agent() { # stop_agent HOST: SIGTERM, wait for its exit
	local pid=${AGENT[$1]}
	kill -TERM "$pid"
	for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done
	return 1
}
# links HOST: "pin link_id prog_id" per pinned tcx link of the host's fastpath attachment.
links() {
	local p
	for p in "$PINS/$1/fastpath/links"/*; do
		bpftool link show pinned "$p" --json | jq -r --arg n "$(basename "$p")" '"\($n) \(.id) \(.prog_id)"'
	done
}
tag() { bpftool prog show id "$1" --json | jq -r '"\(.name)=\(.tag)"'; }
map_id() { bpftool map show pinned "$PINS/$1/fastpath/$2" --json | jq -r .id; }
# report BIN HOST: the host's fastpath section of `peregrine status`.
report() {
	{ "$1" status 2>&1 || true; } | awk -v h="$2" '/^[^ ]/ { on = ($0 ~ "^fastpath on .*" h "([^-0-9]|$)") } on'
}
# figure REPORT FIELD: flows cached, egress/ingress hits, learned from a status section.
flows() { sed -n 's/.* \([0-9]\+\) flows cached.*/\1/p' <<<"$1" | head -1; }
hits() { sed -n "s/.*fastpath $2 *: hits \([0-9]\+\).*/\1/p" <<<"$1" | head -1; }
learned() { sed -n "s/.*fastpath $2 *: .* learned \([0-9]\+\).*/\1/p" <<<"$1" | head -1; }
resets() { # resets NS: TCP EstabResets + OutRsts
	ip netns exec "$1" cat /proc/net/snmp | awk '$1 == "Tcp:" { if (!n) { for (i = 2; i <= NF; i++) c[$i] = i; n = 1 } else print $c["EstabResets"] + $c["OutRsts"] }'
}

# --- lab and the old binary's agents ------------------------------------------------------------
echo "old: $OLD_COMMIT ($("$OLD" --version 2>/dev/null || echo "$OLD")), new: $(git -C "$REPO" rev-parse --short HEAD)"
LABFLAGS=()
[[ $V6 == 1 ]] && LABFLAGS=(--ipv6 --ipv6-underlay)
"$NEW" lab up --style flannel --name "$NAME" --hosts 2 --containers 1 "${LABFLAGS[@]}" >"$WORK/lab.log" 2>&1 9>&- ||
	{ cat "$WORK/lab.log"; die "lab up failed"; }
for h in "${HOSTS[@]}"; do
	PORT[$h]=$(free_port)
	printf 'modes:\n  fastpath: {}\nlisten: 127.0.0.1:%s\nreconcile_interval: 1s\n' "${PORT[$h]}" >"$WORK/$h.yaml"
	start_agent "$OLD" "$h" old
done
for h in "${HOSTS[@]}"; do
	wait_ready "$h" 60 || { cat "$WORK/agent-old-$h.log"; die "the old agent of $h did not become ready"; }
done
pass "old agents ($OLD_COMMIT) attached fastpath to ${HOSTS[*]} and are ready"

# --- the stream --------------------------------------------------------------------------------
FAMILY=-4
[[ $V6 == 1 ]] && FAMILY=-6
DST=$(ip -n "$C2" $FAMILY -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }')
echo "stream: $C1 -> $DST:5201 (iperf3, ${SECS} s, 100 ms intervals, rate ${RATE/#0/uncapped})"
R0=$(($(resets "$C1") + $(resets "$C2")))
ip netns exec "$C2" iperf3 -s -1 -p 5201 >"$WORK/iperf3-server.log" 2>&1 </dev/null 9>&- &
PIDS+=("$!")
sleep 0.5
BFLAG=()
[[ $RATE != 0 ]] && BFLAG=(-b "$RATE")
STREAM_T0=$(now)
ip netns exec "$C1" iperf3 -c "$DST" -p 5201 -t "$SECS" -i 0.1 "${BFLAG[@]}" --json >"$WORK/iperf3.json" 2>"$WORK/iperf3.err" </dev/null 9>&- &
IPERF=$!
PIDS+=("$IPERF")
sleep $((SWAP_AT - 1))

declare -A BEFORE_LINKS BEFORE_TAGS BEFORE_FLOWMAP BEFORE_FLOWS BEFORE_HITS BEFORE_LEARNED
for h in "${HOSTS[@]}"; do
	BEFORE_LINKS[$h]=$(links "$h")
	BEFORE_TAGS[$h]=$(awk '{ print $3 }' <<<"${BEFORE_LINKS[$h]}" | sort -u | while read -r id; do tag "$id"; done | sort -u)
	BEFORE_FLOWMAP[$h]=$(map_id "$h" prg_fastpath_flow)
	r=$(report "$NEW" "$h") # the new binary reads the old attachment before its upgrade
	! grep -q "live state unavailable" <<<"$r" && [[ -n $(flows "$r") ]] && ok=0 || ok=1
	check $ok "$h: the new binary's status reads the old binary's attachment before the upgrade"
	BEFORE_FLOWS[$h]=$(flows "$r")
	BEFORE_HITS[$h]=$(($(hits "$r" egress) + $(hits "$r" ingress)))
	BEFORE_LEARNED[$h]=$(($(learned "$r" egress) + $(learned "$r" ingress)))
	echo "before, $h: links [$(tr '\n' ';' <<<"${BEFORE_LINKS[$h]}")] flow map ${BEFORE_FLOWMAP[$h]}, ${BEFORE_FLOWS[$h]} flows, ${BEFORE_HITS[$h]} hits, ${BEFORE_LEARNED[$h]} learned"
	echo "before, $h: programs $(tr '\n' ' ' <<<"${BEFORE_TAGS[$h]}")"
	if [[ $V6 == 1 ]]; then
		echo "before, $h: the old binary leaves flannel-v6.1 to the normal path (${BEFORE_HITS[$h]} hits)"
	else
		[[ ${BEFORE_HITS[$h]} -gt 0 ]] && ok=0 || ok=1
		check $ok "$h: the stream takes the old binary's fast path before the upgrade (${BEFORE_HITS[$h]} hits)"
	fi
done
missing_before=$(for m in prg_fastpath_hob prg_fastpath_stat2 prg_fastpath_u6cfg prg_fastpath_vtep6 prg_fastpath_u6dev; do
	[[ -e $PINS/${HOSTS[0]}/fastpath/$m ]] || echo "$m"
done | tr '\n' ' ')
echo "maps the old attachment lacks: ${missing_before:-none}"

# --- the upgrade: stop the old agents, start the new binary's with the same config --------------
UP_T0=$(now)
SWAP_REL=$(awk -v a="$STREAM_T0" -v b="$UP_T0" 'BEGIN { printf "%.2f", b - a }')
for h in "${HOSTS[@]}"; do
	stop_agent "$h" || fail "$h: the old agent did not exit on SIGTERM"
done
STOPPED=$(since "$UP_T0")
for h in "${HOSTS[@]}"; do
	start_agent "$NEW" "$h" new
done
for h in "${HOSTS[@]}"; do
	wait_ready "$h" 60 || { cat "$WORK/agent-new-$h.log"; fail "$h: the new agent did not become ready"; }
done
UPGRADE_S=$(since "$UP_T0")
echo "upgrade: stream second $SWAP_REL; old agents stopped in ${STOPPED} s; new agents ready ${UPGRADE_S} s after the SIGTERM"
for h in "${HOSTS[@]}"; do
	ts=$(sed -n 's/^time=\([^ ]*\) .*programs of an older binary replaced.*/\1/p' "$WORK/agent-new-$h.log" | head -1)
	[[ -n $ts ]] && echo "upgrade: $h's links updated at stream second $(awk -v a="$STREAM_T0" -v b="$(date -d "$ts" +%s.%N)" 'BEGIN { printf "%.2f", b - a }')"
done

for h in "${HOSTS[@]}"; do
	log=$WORK/agent-new-$h.log
	grep -q "programs of an older binary replaced" "$log" && ok=0 || ok=1
	check $ok "$h: the new agent replaced the old binary's programs in place ($(grep -o 'links=.*' "$log" | head -1))"
	! grep -qE "detaching and attaching again|level=ERROR" "$log" && ok=0 || ok=1
	check $ok "$h: the new agent neither detached and attached fastpath nor logged an error"
	after=$(links "$h")
	a_ids=$(awk '{ print $1, $2 }' <<<"$after")
	b_ids=$(awk '{ print $1, $2 }' <<<"${BEFORE_LINKS[$h]}")
	[[ -n $a_ids && $a_ids == "$b_ids" ]] && ok=0 || ok=1
	check $ok "$h: every tcx link kept its pin and id ($(awk '{ printf "%s ", $2 }' <<<"$after"))"
	a_tags=$(awk '{ print $3 }' <<<"$after" | sort -u | while read -r id; do tag "$id"; done | sort -u)
	echo "after,  $h: programs $(tr '\n' ' ' <<<"$a_tags")"
	# The upgrade replaces only the programs whose code changed (their kernel tag, a hash of
	# the instructions, differs); the others keep running. So: when the two binaries' eBPF
	# objects differ, some linked program's tag must have changed, and when they are the same,
	# none may (that the links run what the pins hold is checked below).
	changed=$(comm -13 <(echo "${BEFORE_TAGS[$h]}") <(echo "$a_tags") | cut -d= -f1 | tr '\n' ' ')
	if git -C "$REPO" diff --quiet "$OLD_COMMIT" -- internal/datapath/fastpath/fastpath_bpf_bpfel.o 2>/dev/null; then
		[[ -z $changed ]] && ok=0 || ok=1
		check $ok "$h: the eBPF object is $OLD_COMMIT's: no linked program changed (changed: ${changed:-none})"
	else
		[[ -n $changed ]] && ok=0 || ok=1
		check $ok "$h: the programs whose code changed were replaced in the links (${changed:-none}); the others keep running"
	fi
	pinned_tags=$(for p in "$PINS/$h/fastpath"/prg_fastpath_*; do
		if [[ $(bpftool prog show pinned "$p" --json 2>/dev/null | jq -r .type) == sched_cls ]]; then
			bpftool prog show pinned "$p" --json | jq -r '"\(.name)=\(.tag)"'
		fi
	done | sort -u)
	[[ -z $(comm -13 <(echo "$pinned_tags") <(echo "$a_tags")) ]] && ok=0 || ok=1
	check $ok "$h: the program pins hold the programs the links run (new pods get the new ones)"
	miss=""
	for m in prg_fastpath_nat6 prg_fastpath_ho6 prg_fastpath_learned prg_fastpath_learned_lost \
		prg_fastpath_u6cfg prg_fastpath_vtep6 prg_fastpath_u6dev prg_fastpath_hob prg_fastpath_stat2; do
		[[ -e $PINS/$h/fastpath/$m ]] || miss+=" $m"
	done
	[[ -z $miss ]] && ok=0 || ok=1
	check $ok "$h: the maps the new binary added are pinned${miss:+ (missing:$miss)}"
	[[ $(map_id "$h" prg_fastpath_flow) == "${BEFORE_FLOWMAP[$h]}" ]] && ok=0 || ok=1
	check $ok "$h: the flow table is the same map (id ${BEFORE_FLOWMAP[$h]})"
	if [[ $V6 == 1 ]]; then
		vtep=$(bpftool map lookup pinned "$PINS/$h/fastpath/prg_fastpath_u6cfg" key 0 0 0 0 --json | jq -c '(.formatted // .).value.vtep')
		[[ $vtep != "[0,0,0,0]" && $vtep != null ]] && ok=0 || ok=1
		check $ok "$h: the IPv6 underlay's config is written (prg_fastpath_u6cfg vtep $vtep)"
	fi
done

sleep 2
for h in "${HOSTS[@]}"; do
	r=$(report "$NEW" "$h")
	echo "$r" >"$WORK/status-$h.txt"
	f=$(flows "$r")
	hi=$(($(hits "$r" egress) + $(hits "$r" ingress)))
	le=$(($(learned "$r" egress) + $(learned "$r" ingress)))
	echo "after,  $h: $f flows, $hi hits (+$((hi - BEFORE_HITS[$h]))), $le learned (+$((le - BEFORE_LEARNED[$h])))"
	if [[ $V6 == 1 ]]; then # the old programs never served the stream: nothing to keep
		[[ -n $f && $f -gt 0 ]] && ok=0 || ok=1
		check $ok "$h: the new programs cached the IPv6 stream's flow ($f flows)"
	else
		[[ -n $f && $f -ge ${BEFORE_FLOWS[$h]} && $f -gt 0 ]] && ok=0 || ok=1
		check $ok "$h: the flow table kept its entries ($f flows, ${BEFORE_FLOWS[$h]} before)"
	fi
	[[ $hi -gt $((BEFORE_HITS[$h] + 100)) ]] && ok=0 || ok=1
	check $ok "$h: the stream's packets hit the new programs' fast path (counters kept: ${BEFORE_HITS[$h]} -> $hi)"
	! grep -q "live state unavailable" <<<"$r" && grep -q "managed by the node agent" <<<"$r" &&
		grep -q "agent in the node agent (pid ${AGENT[$h]}), running" <<<"$r" && ! grep -q "CHANGED SINCE ATTACH" <<<"$r" && ok=0 || ok=1
	check $ok "$h: peregrine status is sane (live state read, managed, fastpath's agent running in the new node agent, every knob holds)"
done
"$NEW" status --json >"$WORK/status.json"
n=$(jq --arg a "${HOSTS[0]}" --arg b "${HOSTS[1]}" '[.node_agents[] | select((.target == $a or .target == $b) and .running)] | length' "$WORK/status.json")
[[ $n == 2 ]] && ok=0 || ok=1
check $ok "peregrine status --json lists both new node agents running"

# --- the stream's figures ---------------------------------------------------------------------
wait "$IPERF" || true
if ! jq -e '.intervals | length > 0' "$WORK/iperf3.json" >/dev/null 2>&1; then
	fail "iperf3 gave no result: $(jq -r '.error // empty' "$WORK/iperf3.json" 2>/dev/null) $(cat "$WORK/iperf3.err")"
else
	err=$(jq -r '.error // empty' "$WORK/iperf3.json")
	[[ -z $err ]] && ok=0 || ok=1
	check $ok "the stream ran its ${SECS} s${err:+: $err}"
	jq -r '.intervals[] | .sum | "\(.start) \(.end) \(.bytes) \(.retransmits // 0)"' "$WORK/iperf3.json" >"$WORK/intervals.txt"
	median=$(awk '{ print $3 }' "$WORK/intervals.txt" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
	zero=$(awk '$2 - $1 > 0.05 && $3 == 0' "$WORK/intervals.txt" | wc -l)
	low=$(awk -v m="$median" '$2 - $1 > 0.05 && $3 < m / 2' "$WORK/intervals.txt" | wc -l)
	retr=$(awk '{ s += $4 } END { print s + 0 }' "$WORK/intervals.txt")
	echo "stream: $(wc -l <"$WORK/intervals.txt") intervals of 100 ms, median $((median / 1000)) KB, $(jq -r '.end.sum_sent.bits_per_second / 1e9 | . * 100 | round / 100' "$WORK/iperf3.json") Gbit/s, $retr retransmissions; around the upgrade (s, KB):"
	awk -v s="$SWAP_REL" -v u="$UPGRADE_S" '$1 >= s - 0.5 && $1 <= s + u + 0.5 { printf "  %5.1f-%5.1f %7d KB %d retr\n", $1, $2, $3 / 1000, $4 }' "$WORK/intervals.txt"
	[[ $zero -eq 0 ]] && ok=0 || ok=1
	check $ok "the stream never stalled (no 100 ms interval without bytes; $low under half the median)"
	echo "stream: $retr retransmissions in all"
fi
R1=$(($(resets "$C1") + $(resets "$C2")))
[[ $R1 -eq $R0 ]] && ok=0 || ok=1
check $ok "no TCP reset in the pods ($((R1 - R0)))"

# --- detach with the new binary, then the lab ---------------------------------------------------
ids=$(for h in "${HOSTS[@]}"; do links "$h" | awk '{ print $2 }'; done)
for h in "${HOSTS[@]}"; do
	stop_agent "$h" || fail "$h: the new agent did not exit on SIGTERM"
done
"$NEW" detach --lab --name "$NAME" >"$WORK/detach.log" 2>&1 && ok=0 || ok=1
check $ok "peregrine detach (new binary) of the upgraded attachments"
left=""
for h in "${HOSTS[@]}"; do
	[[ -e $PINS/$h ]] && left+=" $PINS/$h"
	ls /run/peregrine/datapath/"$h".*.json >/dev/null 2>&1 && left+=" /run/peregrine/datapath/$h.*"
done
for id in $ids; do
	bpftool link show id "$id" >/dev/null 2>&1 && left+=" link:$id"
done
[[ -z $left ]] && ok=0 || ok=1
check $ok "nothing of the attachments is left (pins, records, tcx links)${left:+:$left}"
"$NEW" lab down --name "$NAME" >>"$WORK/detach.log" 2>&1 && ok=0 || ok=1
check $ok "peregrine lab down --name $NAME"
! ip netns list | grep -q "^prg-$NAME-" && ok=0 || ok=1
check $ok "no prg-$NAME-* namespace is left"

if [[ $FAILS -gt 0 ]]; then
	echo "upgrade-check: $FAILS check(s) FAILED (logs: rerun with PRG_UPG_KEEP=1)"
	exit 1
fi
echo "upgrade-check: every check passed ($OLD_COMMIT -> $(git -C "$REPO" rev-parse --short HEAD), upgrade ${UPGRADE_S} s)"
