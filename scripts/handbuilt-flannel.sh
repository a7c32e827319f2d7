#!/bin/bash
# A Flannel-like VXLAN overlay built by hand with ip(8), not by peregrine's lab: two "nodes"
# (network namespaces prg-NAME-n1/n2) joined by an underlay veth named ens5, each with flannel.1
# (VNI 1, UDP port 8472, no learning), a cni0 bridge with the node's /24, one pod whose veth has a
# random CNI-like name, L3 routes to the other node's /24 via its flannel.1 address (onlink), and
# static neighbour and FDB entries, as flannel's VXLAN backend programs them.
# Used by the fast path's tests and benchmarks to show it works on an overlay it did not build.
#
#   scripts/handbuilt-flannel.sh up [NAME]     # default NAME: hb; pods: prg-NAME-n1-p1 (10.244.1.2), prg-NAME-n2-p1 (10.244.2.2)
#   scripts/handbuilt-flannel.sh down [NAME]   # removes every namespace prg-NAME-*
set -euo pipefail
cmd=${1:-}
name=${2:-hb}
P=prg-$name
nsx() { ip netns exec "$@"; }
vtep_mac() { printf '0e:00:0a:fa:00:%02x' "$1"; }

down() {
	for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do
		ip netns del "$ns"
	done
}

up() {
	for i in 1 2; do
		ip netns add "$P-n$i"
		ip netns add "$P-n$i-p1"
		nsx "$P-n$i" ip link set lo up
		nsx "$P-n$i-p1" ip link set lo up
		nsx "$P-n$i" sysctl -qw net.ipv4.ip_forward=1
	done
	ip link add ens5 netns "$P-n1" type veth peer name ens5 netns "$P-n2"
	for i in 1 2; do
		h=$P-n$i
		nsx "$h" ip addr add "10.250.0.$i/24" dev ens5
		# NIC-like: frames on the wire are MTU-sized with full checksums; GRO on receive.
		nsx "$h" ethtool -K ens5 tx off gro on >/dev/null 2>&1 || true
		nsx "$h" ip link set ens5 up
		nsx "$h" ip link add flannel.1 type vxlan id 1 local "10.250.0.$i" dev ens5 dstport 8472 nolearning
		nsx "$h" ip link set flannel.1 address "$(vtep_mac "$i")" mtu 1450 up
		nsx "$h" ip addr add "10.244.$i.0/32" dev flannel.1
		nsx "$h" ip link add cni0 type bridge
		nsx "$h" ip addr add "10.244.$i.1/24" dev cni0
		nsx "$h" ip link set cni0 mtu 1450 up
		veth=veth$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
		nsx "$h" ip link add "$veth" type veth peer name eth0 netns "$h-p1"
		nsx "$h" ip link set "$veth" master cni0 mtu 1450 up
		nsx "$h-p1" ip addr add "10.244.$i.2/24" dev eth0
		nsx "$h-p1" ip link set eth0 mtu 1450 up
		nsx "$h-p1" ip route add default via "10.244.$i.1"
	done
	for i in 1 2; do
		j=$((3 - i))
		h=$P-n$i
		nsx "$h" ip neigh add "10.244.$j.0" lladdr "$(vtep_mac "$j")" dev flannel.1 nud permanent
		nsx "$h" bridge fdb add "$(vtep_mac "$j")" dev flannel.1 dst "10.250.0.$j" self permanent
		nsx "$h" ip route add "10.244.$j.0/24" via "10.244.$j.0" dev flannel.1 onlink
	done
}

case $cmd in
up) down; up ;;
down) down ;;
*) echo "usage: $0 up|down [NAME]" >&2; exit 2 ;;
esac
