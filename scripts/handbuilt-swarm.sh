#!/bin/bash
# A Docker-swarm-like overlay layout built by hand with ip(8): two "nodes" (network namespaces
# prg-NAME-n1/n2) joined by an underlay veth eth0 (10.251.0.N/24, no default route), each with
# two overlays as Docker's overlay driver lays them out: swarm's "ingress" (VNI 4096, 10.0.0.0/24)
# and a user overlay (VNI 4097, 10.0.1.0/24). Each overlay lives in its own namespace, kept the
# way dockerd keeps it: a file under the node's exec-root (/run/prg-NAME-nN/netns/1-ovK), not
# under /var/run/netns. There: bridge br0, vxlan0 (UDP 4789, no local address and no dev: made
# in the node's namespace and moved in, so its underlay is the node's), and static FDB "dst" and
# neighbour entries for each remote container (vxlan0 answers ARP for them: proxy). One container
# per node and overlay: prg-NAME-nN-cK with eth0 (MAC 02:42 + its address) on br0.
# Used by the fast path's tests to show it serves every overlay of such a node.
#
#   scripts/handbuilt-swarm.sh up [NAME]                     # default NAME: sw; containers 10.0.K.(10N+1)
#   scripts/handbuilt-swarm.sh addpod NAME NODE OVERLAY ID   # container prg-NAME-nNODE-cOVERLAY-ID, 10.0.OVERLAY.(10 NODE+ID), ID 2-9
#   scripts/handbuilt-swarm.sh delpod NAME NODE OVERLAY ID
#   scripts/handbuilt-swarm.sh addoverlay|deloverlay NAME NODE OVERLAY   # overlay OVERLAY's namespace on NODE (and its container) comes or goes
#   scripts/handbuilt-swarm.sh down [NAME]                   # removes every namespace and file it made
set -euo pipefail
cmd=${1:-}
name=${2:-sw}
P=prg-$name
nsx() { ip netns exec "$@"; }
ovns() { echo "/run/$P-n$1/netns/1-ov$2"; }   # node, overlay
ovx() { local f; f=$(ovns "$1" "$2"); shift 2; nsenter --net="$f" "$@"; }
mac() { printf '02:42:0a:00:%02x:%02x' "$1" "$2"; }  # overlay, host byte

down() {
	for f in /run/"$P"-n*/netns/*; do
		[ -e "$f" ] || continue
		umount "$f" 2>/dev/null || true
		rm -f "$f"
	done
	rm -rf /run/"$P"-n*
	for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do
		ip netns del "$ns"
	done
}

# container NODE OVERLAY HOSTBYTE NETNS: a container on the overlay's br0 on NODE.
container() {
	local i=$1 k=$2 b=$3 c=$4 veth
	ip netns add "$c"
	nsx "$c" ip link set lo up
	veth=veth$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
	ovx "$i" "$k" ip link add "$veth" type veth peer name eth0 netns "/var/run/netns/$c" 2>/dev/null ||
		{ ovx "$i" "$k" ip link add "$veth" type veth peer name eth0 && ovx "$i" "$k" ip link set eth0 netns "/var/run/netns/$c"; }
	ovx "$i" "$k" ip link set "$veth" master br0 mtu 1450 up
	nsx "$c" ip link set eth0 address "$(mac "$k" "$b")" mtu 1450 up
	nsx "$c" ip addr add "10.0.$k.$b/24" dev eth0
}

# peer NODE OVERLAY HOSTBYTE: the other node learns a container of NODE, as docker programs it.
peer() {
	local i=$1 k=$2 b=$3 j=$((3 - $1)) op=${4:-add}
	if [ "$op" = add ]; then
		ovx "$j" "$k" bridge fdb add "$(mac "$k" "$b")" dev vxlan0 dst "10.251.0.$i" self permanent
		ovx "$j" "$k" ip neigh add "10.0.$k.$b" lladdr "$(mac "$k" "$b")" dev vxlan0 nud permanent
	else
		ovx "$j" "$k" ip neigh del "10.0.$k.$b" dev vxlan0 || true
		ovx "$j" "$k" bridge fdb del "$(mac "$k" "$b")" dev vxlan0 dst "10.251.0.$i" self || true
	fi
}

# overlay NODE K: overlay K's namespace on NODE with its bridge, vxlan0 and one container.
overlay() {
	local i=$1 k=$2 h=$P-n$1 tmp=$P-tmp$1$2 f
	# dockerd makes the sandbox, then bind-mounts it under its exec-root.
	ip netns add "$tmp"
	f=$(ovns "$i" "$k")
	touch "$f"
	mount --bind "/var/run/netns/$tmp" "$f"
	ip netns del "$tmp"
	ovx "$i" "$k" ip link set lo up
	ovx "$i" "$k" ip link add br0 type bridge
	ovx "$i" "$k" ip addr add "10.0.$k.1/24" dev br0
	ovx "$i" "$k" ip link set br0 mtu 1450 up
	nsx "$h" ip link add "vx-00100$k" type vxlan id $((4096 + k)) dstport 4789 nolearning proxy
	nsx "$h" ip link set "vx-00100$k" netns "$f"
	ovx "$i" "$k" ip link set "vx-00100$k" name vxlan0
	ovx "$i" "$k" ip link set vxlan0 master br0 mtu 1450 up
	container "$i" "$k" $((10 * i + 1)) "$h-c$k"
}

# deloverlay NODE K: the last container left: docker removes the overlay's namespace.
deloverlay() {
	local i=$1 k=$2 f
	f=$(ovns "$i" "$k")
	ip netns del "$P-n$i-c$k"
	umount "$f"
	rm -f "$f"
}

up() {
	for i in 1 2; do
		ip netns add "$P-n$i"
		nsx "$P-n$i" ip link set lo up
	done
	ip link add eth0 netns "$P-n1" type veth peer name eth0 netns "$P-n2"
	for i in 1 2; do
		h=$P-n$i
		nsx "$h" ip addr add "10.251.0.$i/24" dev eth0
		nsx "$h" ethtool -K eth0 tx off gro on >/dev/null 2>&1 || true
		nsx "$h" ip link set eth0 up
		mkdir -p "/run/$h/netns"
		for k in 0 1; do overlay "$i" "$k"; done
	done
	for i in 1 2; do for k in 0 1; do peer "$i" "$k" $((10 * i + 1)); done; done
}

case $cmd in
up) down; up ;;
down) down ;;
addpod)
	i=$3 k=$4 id=$5
	container "$i" "$k" $((10 * i + id)) "$P-n$i-c$k-$id"
	peer "$i" "$k" $((10 * i + id))
	;;
delpod)
	i=$3 k=$4 id=$5
	peer "$i" "$k" $((10 * i + id)) del
	ip netns del "$P-n$i-c$k-$id"
	;;
addoverlay)
	overlay "$3" "$4"
	peer "$3" "$4" $((10 * $3 + 1))
	j=$((3 - $3))
	peer "$j" "$4" $((10 * j + 1)) # the other node's container, into the new namespace
	;;
deloverlay)
	peer "$3" "$4" $((10 * $3 + 1)) del
	deloverlay "$3" "$4"
	;;
*) echo "usage: $0 up|down [NAME] | addpod|delpod NAME NODE OVERLAY ID | addoverlay|deloverlay NAME NODE OVERLAY" >&2; exit 2 ;;
esac
