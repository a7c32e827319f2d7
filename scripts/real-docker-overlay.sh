#!/bin/bash
# A real docker swarm overlay on one machine: two "nodes" (network namespaces prg-NAME-n1/n2) joined
# by an underlay veth (eth0, 10.251.0.1-2/24) that only these namespaces carry, one dockerd (Debian's
# docker.io) per node namespace, swarm init on n1 and join on n2 over the underlay, an attachable
# user overlay "prg-ov" (10.252.0.0/24; swarm gives its ingress VNI 4096, this one 4097) and K
# busybox containers per node on it. The image is imported from busybox-static: nothing is pulled.
#
#   scripts/real-docker-overlay.sh up [NAME]     # default NAME: sw; prints how long it took
#   scripts/real-docker-overlay.sh info [NAME]   # KEY=value lines: sockets, containers, IPs, netns
#   scripts/real-docker-overlay.sh down [NAME]   # removes everything up made, also after a failed up
#   PRG_SWARM_CONTAINERS=K (default 1) containers per node: prg-NAME-nI-cJ at 10.252.0.<10*I+J>.
#
# Each dockerd runs in its node's network namespace but the host's mount namespace (nsenter --net,
# not ip netns exec, whose private mount namespace would hide docker's namespace files under the
# exec-root from everything else). Everything it keeps lives under /run/prg-NAME-nI: --data-root,
# --exec-root (docker's own namespaces: exec/netns/*), --pidfile, the API socket, its containerd.
# Its iptables rules go to its node's netfilter only (a namespace's tables are its own); the host's
# are untouched. Needs scripts/setup-docker.sh (docker.io, busybox-static).
set -euo pipefail
cmd=${1:-}
name=${2:-sw}
[[ $name =~ ^[a-z0-9]{1,8}$ ]] || { echo "NAME must be 1-8 of [a-z0-9]" >&2; exit 2; }
P=prg-$name
K=${PRG_SWARM_CONTAINERS:-1}
[[ $K =~ ^[1-9]$ ]] || { echo "PRG_SWARM_CONTAINERS must be 1-9" >&2; exit 2; }
NET=prg-ov
IMG=prg-busybox:1
DOCKER=/usr/bin/docker   # docker.io's client; another docker on PATH may be a newer, different one
say() { printf '[swarm-lab] %s\n' "$*" >&2; }
die() { printf '[swarm-lab] error: %s\n' "$*" >&2; exit 1; }
root() { echo "/run/$P-n$1"; }
d() { local i=$1; shift; DOCKER_CONFIG="$(root "$i")/client" "$DOCKER" -H "unix://$(root "$i")/docker.sock" "$@"; }
alive() { [[ -S $(root "$1")/docker.sock ]] && d "$1" version >/dev/null 2>&1; }

# Processes started for node i: dockerd (pidfile) and whatever names its root in its command line
# (containerd, the shims). Matched by path, which is unique to this lab.
node_pids() {
	local r pid
	r=$(root "$1")
	for pid in /proc/[0-9]*; do
		pid=${pid#/proc/}
		tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$r/" && echo "$pid"
	done
	return 0
}

stop_node() {
	local i=$1 r pids t
	r=$(root "$i")
	if alive "$i"; then
		# Kill the containers first: dockerd's own shutdown would wait 10 s on each (sleep ignores TERM as pid 1).
		pids=$(d "$i" ps -aq)
		[[ -z $pids ]] || d "$i" rm -f $pids >/dev/null 2>&1 || true
	fi
	if [[ -s $r/dockerd.pid ]]; then kill -TERM "$(cat "$r/dockerd.pid")" 2>/dev/null || true; fi
	for t in $(seq 1 50); do
		pids=$(node_pids "$i")
		[[ -z $pids ]] && break
		((t == 30)) && kill -KILL $pids 2>/dev/null
		sleep 0.2
	done
	[[ -z $(node_pids "$i") ]] || say "warning: processes of $r still running: $(node_pids "$i" | tr '\n' ' ')"
	# Docker's namespace files (nsfs bind mounts under exec/netns) and any storage mounts, deepest first.
	if [[ -e $r/made-run-docker ]]; then rmdir /run/docker/plugins /run/docker 2>/dev/null || true; fi
	if [[ -d $r ]]; then
		awk -v r="$r/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
			umount "$m" 2>/dev/null || umount -l "$m"
		done
		rm -rf "$r"
	fi
	# cgroupfs: containers ran under /<node>/<id> in each hierarchy. A container whose shim was
	# killed outlives it (it is pid 1 of its own pid namespace): kill what is left in its cgroups.
	local cg
	for cg in /sys/fs/cgroup/*/"$P-n$i" /sys/fs/cgroup/"$P-n$i"; do
		[[ -d $cg ]] || continue
		pids=$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
		[[ -z $pids ]] || { kill -KILL $pids 2>/dev/null; sleep 0.2; }
		find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
}

down() {
	stop_node 2
	stop_node 1
	local ns
	for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-n[0-9]+$" || true); do
		ip netns del "$ns"
	done
}

# A busybox root file system: /bin/busybox and one symlink per applet, imported as $IMG.
import_busybox() {
	local i=$1 t
	t=$(mktemp -d /tmp/prg-busybox.XXXXXX)
	mkdir -p "$t/bin" "$t/tmp" "$t/etc"
	cp /bin/busybox "$t/bin/busybox"
	for a in $(/bin/busybox --list); do
		[[ $a == busybox ]] || ln -s busybox "$t/bin/$a"
	done
	tar -C "$t" -c . | d "$i" import --change 'CMD ["/bin/sh"]' - "$IMG" >/dev/null
	rm -rf "$t"
}

close_fds() {
	local f
	for f in /proc/$BASHPID/fd/*; do  # 255: bash's own, close-on-exec
		f=${f##*/}
		((f > 2 && f != 255)) && eval "exec $f>&-"
	done
	return 0
}

start_node() {
	local i=$1 r ns t
	r=$(root "$i")
	ns=$P-n$i
	mkdir -p "$r/client"
	# dockerd makes /run/docker/plugins whatever its exec-root: remember to remove it if it was not there.
	[[ -e /run/docker ]] || touch "$r/made-run-docker"
	echo '{}' >"$r/daemon.json"  # not /etc/docker/daemon.json, whatever it says
	# dockerd outlives this script: not in its process group (setsid), and without the descriptors
	# it inherited beyond 0-2 (a caller's flock on the integration lock would be held until down).
	close_fds
	setsid nsenter --net="/run/netns/$ns" -- /usr/sbin/dockerd \
		--config-file "$r/daemon.json" --data-root "$r/data" --exec-root "$r/exec" \
		--pidfile "$r/dockerd.pid" -H "unix://$r/docker.sock" \
		--storage-driver vfs --bridge none --userland-proxy=false --iptables=true \
		--cgroup-parent "/$ns" --log-level warn </dev/null >"$r/dockerd.log" 2>&1 &
	for t in $(seq 1 150); do
		alive "$i" && return 0
		sleep 0.2
	done
	tail -20 "$r/dockerd.log" >&2
	die "dockerd in $ns did not answer in 30 s"
}

up() {
	[[ -x /usr/sbin/dockerd && -x $DOCKER && -x /bin/busybox ]] ||
		die "docker.io or busybox-static missing: run scripts/setup-docker.sh"
	local t0 i j tok
	t0=$(date +%s.%N)
	for i in 1 2; do
		ip netns add "$P-n$i"
		ip -n "$P-n$i" link set lo up
	done
	ip link add eth0 netns "$P-n1" type veth peer name eth0 netns "$P-n2"
	for i in 1 2; do
		ip -n "$P-n$i" addr add "10.251.0.$i/24" dev eth0
		# NIC-like, as the other labs: MTU frames with full checksums on the wire, GRO on receive.
		ip netns exec "$P-n$i" ethtool -K eth0 tx off gro on >/dev/null 2>&1 || true
		ip -n "$P-n$i" link set eth0 up
	done
	local p1 p2
	start_node 1 & p1=$!
	start_node 2 & p2=$!
	wait $p1 && wait $p2 || die "a dockerd did not start"
	import_busybox 1 & p1=$!
	import_busybox 2 & p2=$!
	wait $p1 && wait $p2 || die "busybox import failed"
	d 1 swarm init --advertise-addr 10.251.0.1 --listen-addr 10.251.0.1:2377 >/dev/null
	tok=$(d 1 swarm join-token -q worker)
	d 2 swarm join --token "$tok" --advertise-addr 10.251.0.2 --listen-addr 10.251.0.2:2377 10.251.0.1:2377 >/dev/null
	d 1 network create -d overlay --attachable --subnet 10.252.0.0/24 "$NET" >/dev/null
	for i in 1 2; do
		for j in $(seq 1 "$K"); do
			d "$i" run -d --pull never --name "$P-n$i-c$j" --hostname "n$i-c$j" \
				--network "$NET" --ip "10.252.0.$((10 * i + j))" "$IMG" sleep 86400 >/dev/null
		done
	done
	# Prove it: each first container pings the other node's.
	d 1 exec "$P-n1-c1" ping -c 2 -W 2 10.252.0.21 >/dev/null || die "n1-c1 cannot reach n2-c1 over $NET"
	d 2 exec "$P-n2-c1" ping -c 2 -W 2 10.252.0.11 >/dev/null || die "n2-c1 cannot reach n1-c1 over $NET"
	say "up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s: $(/usr/sbin/dockerd --version)"
	info
}

info() {
	local i j c
	echo "VNIS=$(d 1 network inspect -f '{{index .Options "com.docker.network.driver.overlay.vxlanid_list"}}' ingress "$NET" | tr '\n' ' ')"
	for i in 1 2; do
		echo "N${i}_NETNS=$P-n$i"
		echo "N${i}_SOCK=$(root "$i")/docker.sock"
		echo "N${i}_NETNSDIR=$(root "$i")/exec/netns"
		for j in $(seq 1 "$K"); do
			c=$P-n$i-c$j
			echo "N${i}_C${j}=$c"
			echo "N${i}_C${j}_IP=$(d "$i" inspect -f "{{(index .NetworkSettings.Networks \"$NET\").IPAddress}}" "$c")"
			echo "N${i}_C${j}_NETNS=$(d "$i" inspect -f '{{.NetworkSettings.SandboxKey}}' "$c")"
		done
	done
}

case $cmd in
up)
	down
	trap 'rc=$?; ((rc == 0)) || { say "up failed: tearing down"; down; }' EXIT
	up
	;;
info) info ;;
down) down ;;
*) echo "usage: $0 up|info|down [NAME]" >&2; exit 2 ;;
esac
