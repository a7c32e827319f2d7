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
 *                            the container's veth and MAC; the gate (ezp_gate) lets the frame go
 *                            straight to the pod only where the overlay's normal path delivered
 *                            its flow lately: rewrite, PACKET_HOST, redirect_peer into the
 *                            container (no bridge, no veth backlog); otherwise the frame enters
 *                            the tenant's VXLAN device, the normal path, tagged
 *            prg_ezp_dlv     tcx ingress of each pod's eth0: records the tagged frames the
 *                            normal path delivered (the gate's far end)
 *
 * Tenants (lab --tenants N): each tenant has its own overlay namespace (VXLAN device, VNI,
 * bridge) and its own relay pair (host end ezp0, ezp0-t2, ...; overlay end ezp0). The tenant is
 * the VID on the host-ToR link: an egress entry carries its VID and its relay, ezp_host_vid maps
 * a VID to the tenant's endpoint domain and relay. Overlapping container addresses never mix:
 * the pod table is keyed by domain, and the bridge-side veths of different tenants have
 * distinct ifindexes (the lab gives them; attach checks).
 */
#include "ezpath.h"
#include "common.h"
#include "pod.h"

char LICENSE[] SEC("license") = "GPL";

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

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
	EZH_GATE_UNSEEN, /* the gate: the normal path did not deliver the flow to the pod within the window */
	EZH_GATE_ELSEWHERE, /* the gate: the normal path delivered it through another veth or MAC */
	EZH_GATE_PROBE,  /* the gate: the flow's periodic re-verification through the normal path */
	EZH_GATE_FRAG,   /* the gate: an IP fragment (no flow key): always the normal path */
	EZH_DLV,         /* prg_ezp_dlv: a tagged frame the normal path delivered to a pod (recorded) */
	EZH_DLV_NOPOD,   /* prg_ezp_dlv: a tagged frame at a pod device attach did not describe */
	EZH_N,
};

struct ezp_host_cfg {
	__u32 uplink;   /* host ns: the uplink (eth0) */
	__u32 relay_host; /* host ns: ezp0 */
	__u32 relay_ov;   /* overlay ns: ezp0 */
	__u32 pad;
	__u64 verify_ns; /* the gate: one frame per flow through the normal path this often */
	__u64 window_ns; /* the gate: deliver only flows the normal path delivered this recently (<= 1 s) */
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

/* ---- The gate (issue 28, rule a): an offloaded frame skips the overlay namespace's bridge,
 * netfilter and the pod veth's tc, so it is handed to the pod only while the normal path (the
 * tenant's VXLAN device onward) delivered its flow to that same pod, through the same veth, at
 * most window_ns ago; one frame per flow per verify_ns takes the normal path to re-verify. The
 * frames handed to the normal path carry EZP_TC_INDEX_PROBE, and prg_ezp_dlv, at tcx ingress of
 * each pod's own eth0 (after everything the normal path does, and where bpf_redirect_peer puts an
 * offloaded frame), records their delivery. Same design as prism's (bpf/prism_gate.h). */

#define EZP_TC_INDEX_PROBE 0xfa5a

struct ezp_flow_key {
	__u32 domain;
	__u32 family;
	struct prg_flow flow;
};

struct ezp_acc {
	__u64 seen_ns;  /* last delivery of the flow by the normal path (prg_ezp_dlv) */
	__u64 probe_ns; /* last frame of it prg_ezp_deliver sent through the normal path */
	__u32 ifindex;  /* the bridge-side veth the delivery came through */
	__u8 mac[6];    /* its destination MAC */
	__u16 pad;
};

struct ezp_pod {
	__u32 domain;  /* the tenant's endpoint domain (overlay ns inode) */
	__u32 ifindex; /* the bridge-side veth of this pod device, from the host side */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ezp_flow_key);
	__type(value, struct ezp_acc);
} prg_ezp_acc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct prg_dev_key);
	__type(value, struct ezp_pod);
} prg_ezp_pod SEC(".maps");

static __always_inline int ezp_mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

/* ezp_gate says whether an offloaded frame of flow h may go straight to pod; 0: the caller hands
 * it (tagged) to the normal path. */
static __always_inline int ezp_gate(struct __sk_buff *ctx, const struct ezp_host_cfg *cfg, __u32 domain,
				    const struct prg_hdrs *h, const struct prg_pod *pod)
{
	if (h->frag) {
		ezp_count(&prg_ezp_hstat, EZH_GATE_FRAG);
		return 0;
	}
	struct ezp_flow_key k = {.domain = domain, .family = h->family, .flow = h->flow};
	__builtin_memset(k.flow.pad, 0, sizeof(k.flow.pad));
	struct ezp_acc *a = bpf_map_lookup_elem(&prg_ezp_acc, &k);
	__u64 now = bpf_ktime_get_ns();
	if (!a || now - a->seen_ns > cfg->window_ns) {
		ezp_count(&prg_ezp_hstat, EZH_GATE_UNSEEN);
		return 0;
	}
	if (a->ifindex != pod->ifindex || !ezp_mac_eq(a->mac, pod->ctr_mac)) {
		ezp_count(&prg_ezp_hstat, EZH_GATE_ELSEWHERE);
		return 0;
	}
	if (now - a->probe_ns >= cfg->verify_ns) {
		a->probe_ns = now;
		ezp_count(&prg_ezp_hstat, EZH_GATE_PROBE);
		return 0;
	}
	return 1;
}

static __always_inline int ezp_record(struct __sk_buff *ctx)
{
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
	struct prg_dev_key dk = {};
	struct prg_hdrs h = {};
	struct prg_pkt p;
	int r;

	ctx->tc_index = 0;
	if (!skb->dev)
		return EZP_TCX_NEXT;
	prg_dev_key_of(skb->dev, &dk);
	struct ezp_pod *pod = bpf_map_lookup_elem(&prg_ezp_pod, &dk);
	if (!pod) {
		ezp_count(&prg_ezp_hstat, EZH_DLV_NOPOD);
		return EZP_TCX_NEXT;
	}
	prg_pkt_tc(&p, ctx);
	PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, 0, 0, &h));
	struct ethhdr *eth = prg_hdr(&p, 0, struct ethhdr);
	if (r != PRG_OK || !eth || h.frag)
		return EZP_TCX_NEXT;
	struct ezp_flow_key k = {.domain = pod->domain, .family = h.family, .flow = h.flow};
	__builtin_memset(k.flow.pad, 0, sizeof(k.flow.pad));
	struct ezp_acc v = {.ifindex = pod->ifindex};
	__builtin_memcpy(v.mac, eth->h_dest, sizeof(v.mac));
	v.seen_ns = bpf_ktime_get_ns();
	struct ezp_acc *a = bpf_map_lookup_elem(&prg_ezp_acc, &k);
	v.probe_ns = a ? a->probe_ns : v.seen_ns;
	bpf_map_update_elem(&prg_ezp_acc, &k, &v, BPF_ANY);
	ezp_count(&prg_ezp_hstat, EZH_DLV);
	return EZP_TCX_NEXT;
}

/* prg_ezp_dlv: tcx ingress of each pod's eth0 (the pod's end of its veth), the far end of the
 * normal path; records the tagged frames prg_ezp_deliver handed to the overlay. Never changes a
 * verdict. */
SEC("tcx/ingress")
int prg_ezp_dlv(struct __sk_buff *ctx)
{
	if (ctx->tc_index != EZP_TC_INDEX_PROBE)
		return EZP_TCX_NEXT;
	return ezp_record(ctx);
}

/* prg_ezp_dlvt is prg_ezp_dlv for BPF_PROG_TEST_RUN, which cannot set tc_index: every frame
 * counts as tagged. Never attached. */
SEC("tc")
int prg_ezp_dlvt(struct __sk_buff *ctx)
{
	return ezp_record(ctx);
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
	__u32 daddr = ip->daddr;
	struct prg_pod *pod;
	int pr = prg_pod_lookup4(&prg_ezp_ep, &prg_ezp_podport, domain, daddr, &pod);
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
	if (vx) { /* attach refuses a tenant without a VXLAN device; vx 0 is a test run's setup */
		/* The gate (rule a): the flow goes straight to the pod only where the normal path
		 * delivered it there lately; otherwise this frame takes the normal path, tagged. */
		struct ezp_host_cfg *cfg = host_cfg();
		struct prg_hdrs h = {};
		int r2;
		PRG_TC_PARSE(r2, &p, ctx, prg_parse_frame(&p, 0, 0, &h));
		if (!cfg || r2 != PRG_OK || !ezp_gate(ctx, cfg, domain, &h, pod)) {
			ctx->tc_index = EZP_TC_INDEX_PROBE;
			return bpf_redirect(vx, BPF_F_INGRESS);
		}
		prg_pkt_tc(&p, ctx);
		eth = prg_hdr(&p, 0, struct ethhdr);
		if (!eth) {
			ezp_count(&prg_ezp_hstat, EZH_ERR);
			return EZP_TC_ACT_SHOT;
		}
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
