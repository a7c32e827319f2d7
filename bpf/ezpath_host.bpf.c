// SPDX-License-Identifier: GPL-2.0
/*
 * EZPath's host side: what the paper's OVS rules do, as tcx programs. For an offloaded
 * flow the host only pushes or pops an 802.1Q tag (VID = the tenant on this host-ToR link); the
 * ToR switch does the VXLAN work (ezpath_tor.bpf.c). Everything else (ARP, broadcast, flows not
 * offloaded) returns TCX_NEXT and takes the overlay as before.
 *
 * Docker layout: the containers' bridge-side veths are in the overlay namespace, the uplink in the
 * host namespace, and a redirect cannot leave its namespace. The paper's OVS has the NIC as a
 * port of the container bridge; here attach adds a veth pair "ezp0" between the overlay and the
 * host namespace and the frames cross it with bpf_redirect_peer (no backlog, no bridge):
 *
 *   egress   prg_ezp_port    tcx ingress of a container's bridge-side veth (overlay ns):
 *                            ezp_host_egress[veth, inner dst] -> VID: push the tag,
 *                            redirect_peer to ezp0 (host ns)
 *            prg_ezp_relay   tcx ingress of ezp0 in the host ns: tagged -> bpf_redirect to the
 *                            uplink (eth0), out to the ToR. Nothing untagged comes here.
 *   ingress  prg_ezp_uplink  tcx ingress of the uplink: tagged -> ezp_host_vid[VID] names the
 *                            tenant's relay: redirect_peer to its ezp0 in the tenant's overlay
 *                            ns; untagged (the overlay's VXLAN, ARP...) -> TCX_NEXT
 *            prg_ezp_deliver tcx ingress of ezp0 in the overlay ns: ezp_host_vid[VID] -> the
 *                            tenant's endpoint domain; pop the tag; the pod table (pod.h) gives
 *                            the container's veth and MAC: rewrite, PACKET_HOST, redirect_peer
 *                            into the container (no bridge, no veth backlog)
 *
 * Tenants (lab --tenants N): each tenant has its own overlay namespace (VXLAN device, VNI,
 * bridge) and its own relay pair (host end ezp0, ezp0-t2, ...; overlay end ezp0). The tenant is
 * the VID on the host-ToR link: an egress entry carries its VID and its relay, ezp_host_vid maps
 * a VID to the tenant's endpoint domain and relay. Overlapping container addresses never mix:
 * the pod table is keyed by domain, and the bridge-side veths of different tenants have
 * distinct ifindexes (the lab gives them; attach checks).
 */
#include "ezpath.h"
#include "pod.h"

char LICENSE[] SEC("license") = "GPL";

/* Counters (prg_ezp_hstat index); keep in step with host.go. */
enum {
	EZH_TAGGED,      /* frames from containers tagged and sent toward the ToR */
	EZH_RELAYED,     /* tagged frames relayed to the uplink */
	EZH_UP_TAGGED,   /* tagged frames from the ToR handed to the overlay namespace */
	EZH_DELIVERED,   /* untagged and delivered into a container */
	EZH_MISS_VID,    /* tagged frame with a VID that is no tenant here: dropped */
	EZH_MISS_POD,    /* tagged frame for no local pod (or a vanished one): dropped */
	EZH_NOT_IP,      /* tagged frame that is not IPv4: dropped */
	EZH_ERR,         /* a helper failed: dropped (tag push: left to the overlay) */
	EZH_UNTAGGED,    /* untagged frame at a relay: dropped */
	EZH_TO_OVERLAY,  /* tagged frame for an address with no pod entry (none, or refused as claimed
			  * by two pods): untagged and handed to the tenant's VXLAN device, whose
			  * bridge (the normal path) delivers it wherever the host's own state says */
	EZH_N,
};

struct ezp_host_cfg {
	__u32 uplink;   /* host ns: the uplink (eth0) */
	__u32 relay_host; /* host ns: ezp0 */
	__u32 relay_ov;   /* overlay ns: ezp0 */
	__u32 pad;
};

struct ezp_egress_key {
	__u32 ifindex; /* the container's bridge-side veth */
	__u32 dst;     /* inner IPv4 destination, network order */
};

struct ezp_egress_val {
	__u32 vid;
	__u32 relay; /* the tenant's relay end (ezp0) in its overlay ns; 0: ezp_host_cfg's relay_ov */
};

struct ezp_vid_val {
	__u32 domain; /* endpoint domain (pod.h): netns inode of the tenant's bridge-side veths */
	__u32 relay;  /* the tenant's relay end in the host ns; 0: ezp_host_cfg's relay_host */
	__u32 vx;     /* the tenant's VXLAN device in its overlay ns (the normal path); 0: none */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ezp_host_cfg);
} ezp_host_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ezp_egress_key);
	__type(value, struct ezp_egress_val);
} ezp_host_egress SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct ezp_vid_val);
} ezp_host_vid SEC(".maps");

PRG_POD_MAPS(prg_ezp_ep, prg_ezp_podport, 4096);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZH_N);
	__type(key, __u32);
	__type(value, __u64);
} prg_ezp_hstat SEC(".maps");

static __always_inline struct ezp_host_cfg *host_cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&ezp_host_cfg, &zero);
}

SEC("tcx/ingress")
int prg_ezp_port(struct __sk_buff *ctx)
{
	struct ezp_host_cfg *cfg = host_cfg();
	if (!cfg || !cfg->relay_ov)
		return EZP_TCX_NEXT;
	struct prg_pkt p;
	prg_pkt_tc(&p, ctx);
	struct ethhdr *eth = prg_hdr(&p, 0, struct ethhdr);
	/* Only unicast IPv4 is offloaded: ARP, broadcast and multicast stay on the overlay. */
	if (!eth || (eth->h_dest[0] & 1) || eth->h_proto != bpf_htons(PRG_ETH_P_IP) || ctx->vlan_present)
		return EZP_TCX_NEXT;
	struct iphdr *ip = prg_hdr(&p, sizeof(*eth), struct iphdr);
	if (!ip || ip->version != 4 || ip->ihl < 5) /* not a readable IPv4 header: the overlay's */
		return EZP_TCX_NEXT;
	struct ezp_egress_key k = {.ifindex = ctx->ifindex, .dst = ip->daddr};
	struct ezp_egress_val *e = bpf_map_lookup_elem(&ezp_host_egress, &k);
	if (!e)
		return EZP_TCX_NEXT;
	if (bpf_skb_vlan_push(ctx, bpf_htons(PRG_ETH_P_8021Q), e->vid)) {
		ezp_count(&prg_ezp_hstat, EZH_ERR);
		return EZP_TCX_NEXT;
	}
	__u32 relay = e->relay ? e->relay : cfg->relay_ov;
	ezp_count(&prg_ezp_hstat, EZH_TAGGED);
	return bpf_redirect_peer(relay, 0);
}

SEC("tcx/ingress")
int prg_ezp_relay(struct __sk_buff *ctx)
{
	struct ezp_host_cfg *cfg = host_cfg();
	struct prg_pkt p;
	prg_pkt_tc(&p, ctx);
	if (!cfg || !cfg->uplink || ezp_vid(ctx, &p) < 0) {
		ezp_count(&prg_ezp_hstat, EZH_UNTAGGED);
		return EZP_TC_ACT_SHOT;
	}
	ezp_count(&prg_ezp_hstat, EZH_RELAYED);
	return bpf_redirect(cfg->uplink, 0);
}

SEC("tcx/ingress")
int prg_ezp_uplink(struct __sk_buff *ctx)
{
	struct ezp_host_cfg *cfg = host_cfg();
	struct prg_pkt p;
	prg_pkt_tc(&p, ctx);
	int vid = ezp_vid(ctx, &p);
	if (!cfg || !cfg->relay_host || vid < 0)
		return EZP_TCX_NEXT;
	/* The tenant's relay; an unknown VID goes to the default one, whose delivery drops it
	 * (counted as miss_vid). */
	__u32 v = vid, relay = cfg->relay_host;
	struct ezp_vid_val *t = bpf_map_lookup_elem(&ezp_host_vid, &v);
	if (t && t->relay)
		relay = t->relay;
	ezp_count(&prg_ezp_hstat, EZH_UP_TAGGED);
	return bpf_redirect_peer(relay, 0);
}

SEC("tcx/ingress")
int prg_ezp_deliver(struct __sk_buff *ctx)
{
	struct prg_pkt p;
	prg_pkt_tc(&p, ctx);
	int vid = ezp_vid(ctx, &p);
	if (vid < 0) {
		ezp_count(&prg_ezp_hstat, EZH_UNTAGGED);
		return EZP_TC_ACT_SHOT;
	}
	__u32 v = vid;
	struct ezp_vid_val *t = bpf_map_lookup_elem(&ezp_host_vid, &v);
	if (!t) {
		ezp_count(&prg_ezp_hstat, EZH_MISS_VID);
		return EZP_TC_ACT_SHOT;
	}
	__u32 domain = t->domain, vx = t->vx;
	if (bpf_skb_vlan_pop(ctx)) {
		ezp_count(&prg_ezp_hstat, EZH_ERR);
		return EZP_TC_ACT_SHOT;
	}
	prg_pkt_tc(&p, ctx);
	struct ethhdr *eth = prg_hdr(&p, 0, struct ethhdr);
	if (!eth || eth->h_proto != bpf_htons(PRG_ETH_P_IP)) {
		ezp_count(&prg_ezp_hstat, EZH_NOT_IP);
		return EZP_TC_ACT_SHOT;
	}
	struct iphdr *ip = prg_hdr(&p, sizeof(*eth), struct iphdr);
	if (!ip || ip->version != 4 || ip->ihl < 5) {
		ezp_count(&prg_ezp_hstat, EZH_NOT_IP);
		return EZP_TC_ACT_SHOT;
	}
	struct prg_pod *pod;
	int pr = prg_pod_lookup4(&prg_ezp_ep, &prg_ezp_podport, domain, ip->daddr, &pod);
	if (pr == PRG_POD_MISS && vx) {
		/* No entry: no pod here, or an address two pods claim (endpoints.Sync refuses it; a
		 * pod's own word cannot tell the rightful one). The pod table never decides then: the
		 * frame enters the overlay as if the VXLAN device had received it, and the bridge's
		 * own FDB (what it learned from the pods' frames) and the overlay namespace's
		 * netfilter deliver it or not, as for any frame of the overlay. */
		ezp_count(&prg_ezp_hstat, EZH_TO_OVERLAY);
		return bpf_redirect(vx, BPF_F_INGRESS);
	}
	if (pr != PRG_POD_OK) {
		ezp_count(&prg_ezp_hstat, EZH_MISS_POD);
		return EZP_TC_ACT_SHOT;
	}
	/* Keep the sender's MAC as the source (docker's overlay is one L2 segment). */
	__u8 smac[6];
	__builtin_memcpy(smac, eth->h_source, 6);
	long r = prg_pod_deliver(ctx, pod->ctr_mac, smac, pod->ifindex);
	if (r < 0) {
		ezp_count(&prg_ezp_hstat, EZH_ERR);
		return EZP_TC_ACT_SHOT;
	}
	ezp_count(&prg_ezp_hstat, EZH_DELIVERED);
	return r;
}
