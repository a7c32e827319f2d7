package lab

import "net/netip"

// Dual-stack Services (--ipv6 --services): every lab Service also gets an IPv6 ClusterIP, and
// the hosts get the rules kube-proxy's IPv6 proxier writes beside the IPv4 ones. A dual-stack
// kube-proxy runs one proxier per family (a "meta proxier"): in iptables mode the same chain
// layout in ip6tables' nat and filter tables, in nftables mode a second table, "ip6 kube-proxy".
// The chain names are the same hashes as IPv4's for a Service (they hash the service port name
// and protocol only); an endpoint's hash takes its "[ip]:port", so its KUBE-SEP- and
// endpoint- chains differ from the IPv4 endpoint's.
//
// ServiceCIDR6 is a /112, the size kind and kubeadm's dual-stack examples give the IPv6 service
// range (kube-apiserver's allocator takes at most 20 host bits in the IPv6 range, /108; a /112
// holds 65 536 ClusterIPs, plenty), from the lab's own ULA prefix (fd70:7267: "prg") but apart
// from the pods' /48 (fd70:7267:0::/48) and the IPv6 underlay (fd70:7267:1::/64), as a
// cluster's service CIDR is apart from its pod CIDR and its nodes' network.
const ServiceCIDR6 = "fd70:7267:2::/112"

// ServiceAddr6 is the n-th address of ServiceCIDR6 (the lab uses ::1 and ::3, as IPv4 .1, .3).
func ServiceAddr6(n int) netip.Addr { return nth6(netip.MustParsePrefix(ServiceCIDR6), n) }

// services6 is the IPv6 view of the lab's Services, as the IPv6 proxier sees them: ClusterIP
// and backend addresses are the IPv6 ones. A NodePort is kept only when the nodes have IPv6
// addresses of their own (--ipv6-underlay): kube-proxy serves an IPv6 NodePort on the node's
// IPv6 addresses, and without an IPv6 underlay the lab's nodes have none but the pod gateway
// (cni0) and flannel.1's /128, which are no node addresses a client outside would use.
func (s *Spec) services6() []Service {
	var out []Service
	for _, sv := range s.LabServices() {
		v := sv
		v.ClusterIP, v.ClusterIP6 = sv.ClusterIP6, ""
		if !s.IPv6Underlay {
			v.NodePort = 0
		}
		v.Backends = nil
		for _, be := range sv.Backends {
			be.Addr, be.Addr6 = be.Addr6, ""
			v.Backends = append(v.Backends, be)
		}
		out = append(out, v)
	}
	return out
}
