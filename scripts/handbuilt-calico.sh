#!/bin/bash
# A Calico-VXLAN-like layout built by hand with ip(8), as calico-node/felix and the calico CNI
# plugin program a node (no Kubernetes): two "nodes" (prg-NAME-n1/n2) joined by an underlay veth
# eth0 (10.252.0.N/24); vxlan.calico (VNI 4096, UDP 4789, local address and dev set) with the
# node's tunnel address 10.65.N.0/32; pods on unbridged veths cali<hex> whose host end has the
# MAC ee:ee:ee:ee:ee:ee and proxy ARP, each reached by a /32 route in the node; in the pod a /32
# address and a default route via 169.254.1.1 (answered by the node's proxy ARP); the node's own
# /26 block blackholed, the other node's block routed via its tunnel address onlink over
# vxlan.calico with static neighbour and FDB entries; a default route on eth0 (proxy ARP answers
# only for addresses the node routes). No bridge anywhere.
# Used by the fast path's tests (TestCalicoLike: the fast path serves this layout) and scripts/calico-bench.sh.
#
#   scripts/handbuilt-calico.sh up [NAME] [PODS]   # default NAME: cal, PODS 1 per node: prg-NAME-nN-pK at 10.65.N.(K+1)
#   scripts/handbuilt-calico.sh down [NAME]
set -euo pipefail
cmd=${1:-}
name=${2:-cal}
pods=${3:-1}
P=prg-$name
nsx() { ip netns exec "$@"; }
vtep_mac() { printf '66:0e:3c:00:00:%02x' "$1"; }

down() {
	for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do
		ip netns del "$ns"
	done
}

up() {
	for i in 1 2; do
		ip netns add "$P-n$i"
		nsx "$P-n$i" ip link set lo up
		nsx "$P-n$i" sysctl -qw net.ipv4.ip_forward=1
	done
	ip link add eth0 netns "$P-n1" type veth peer name eth0 netns "$P-n2"
	for i in 1 2; do
		h=$P-n$i
		nsx "$h" ip addr add "10.252.0.$i/24" dev eth0
		nsx "$h" ip link set eth0 up
		# A node has a default route: proxy ARP answers for 169.254.1.1 only if it routes it.
		nsx "$h" ip route add default via 10.252.0.254 dev eth0 onlink
		nsx "$h" ip link add vxlan.calico type vxlan id 4096 local "10.252.0.$i" dev eth0 dstport 4789 nolearning
		nsx "$h" ip link set vxlan.calico address "$(vtep_mac "$i")" mtu 1450 up
		nsx "$h" ip addr add "10.65.$i.0/32" dev vxlan.calico
		nsx "$h" ip route add blackhole "10.65.$i.0/26"
		for k in $(seq 1 "$pods"); do
			p=$h-p$k
			ip netns add "$p"
			nsx "$p" ip link set lo up
			cali=cali$(od -An -N5 -tx1 /dev/urandom | tr -d ' \n')
			nsx "$h" ip link add "$cali" type veth peer name eth0 netns "$p"
			nsx "$h" ip link set "$cali" address ee:ee:ee:ee:ee:ee mtu 1450 up
			nsx "$h" sysctl -qw "net.ipv4.conf.$cali.proxy_arp=1" "net.ipv4.neigh.$cali.proxy_delay=0" "net.ipv4.conf.$cali.forwarding=1"
			nsx "$h" ip route add "10.65.$i.$((k + 1))/32" dev "$cali" scope link
			nsx "$p" ip addr add "10.65.$i.$((k + 1))/32" dev eth0
			nsx "$p" ip link set eth0 mtu 1450 up
			nsx "$p" ip route add 169.254.1.1 dev eth0 scope link
			nsx "$p" ip route add default via 169.254.1.1 dev eth0
		done
	done
	for i in 1 2; do
		j=$((3 - i))
		h=$P-n$i
		nsx "$h" ip neigh add "10.65.$j.0" lladdr "$(vtep_mac "$j")" dev vxlan.calico nud permanent
		nsx "$h" bridge fdb add "$(vtep_mac "$j")" dev vxlan.calico dst "10.252.0.$j" self permanent
		nsx "$h" ip route add "10.65.$j.0/26" via "10.65.$j.0" dev vxlan.calico onlink
	done
}

case $cmd in
up) down; up ;;
down) down ;;
*) echo "usage: $0 up|down [NAME] [PODS]" >&2; exit 2 ;;
esac
