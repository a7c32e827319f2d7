package fastpath

// Flow flags of Service NAT (bpf/fastpath.bpf.c): a flow the normal path DNATs (a Service's
// ClusterIP to a backend) is cached under the key the pod sent, with the backend the normal
// path chose; an alias entry under the translated key points the backend's replies back to it.
const (
	fDNAT  = 4  // egress replays the DNAT to NatAddr:NatPort, ingress reverses it
	fAlias = 8  // not a flow: the translated view of (Local, NatAddr, Lport, NatPort)
	fNATX  = 16 // translated in a way the fast path does not reproduce (source NAT): normal path
	// Same-node flows (bpf/fastpath_local.h): delivered to a pod on this node with
	// bpf_redirect_peer, the MACs in Tmpl[:12], the receiver's veth in LocIfindex.
	fLocal = 32
	fSNAT  = 64 // same node: the source becomes NatAddr:NatPort (a Service backend's reply)
)
