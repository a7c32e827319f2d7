/* SPDX-License-Identifier: GPL-2.0 */
/*
 * prism's firewall gate, included by prism.bpf.c after its maps, count() and classify():
 * accepted() decides whether an HP frame may skip the normal path, and prg_prism_dlv (at tcx
 * ingress of each pod's own device, the far end of the normal path) records the flows the normal
 * path delivered, and through which veth. Split out of
 * prism.bpf.c to keep each file readable; it is not a header for other programs.
 */
#ifndef PRG_PRISM_GATE_H
#define PRG_PRISM_GATE_H

/* A flow toward a local container, as both programs key it (prg_prism_acc). */
struct prism_flow_key {
	__u32 netns;  /* netns inode of the VXLAN device (the endpoint domain) */
	__u32 family; /* 4 or 6 */
	struct prg_flow flow;
};

struct prism_acc {
	__u64 seen_ns;  /* last time the normal path delivered a frame of the flow to a pod (prg_prism_dlv) */
	__u64 probe_ns; /* last time prg_prism_vx sent one of its frames through the normal path */
	__u64 ask_ns;   /* last time prg_prism_vx asked the agent to make the flow's TCP entry liberal */
	__u32 ifindex;  /* the bridge-side veth that delivery came through */
	__u8 mac[6];    /* the destination MAC the normal path gave it */
	__u16 pad;
};

/* Flows the normal path delivered recently, written by prg_prism_dlv (at the pod's device). */
#define PR_MAX_FLOWS 65536
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PR_MAX_FLOWS);
	__type(key, struct prism_flow_key);
	__type(value, struct prism_acc);
} prg_prism_acc SEC(".maps");

/* TCP flows the gate would redirect but whose conntrack entry still tracks windows strictly: the
 * agent (prism/ctliberal.go) reads each flow key and sets IP_CT_TCP_FLAG_BE_LIBERAL on both
 * directions of that entry with ctnetlink. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} prg_prism_ask SEC(".maps");

/* An unanswered ask is repeated at most this often per flow. */
#define PR_ASK_EVERY_NS (20 * 1000 * 1000ULL)
#define PR_CT_TCP_FLAG_BE_LIBERAL 0x08 /* IP_CT_TCP_FLAG_BE_LIBERAL */

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

/* ---- The firewall gate: redirect only what the normal path accepted ---- */

#define PR_CURRENT_NETNS (-1) /* BPF_F_CURRENT_NETNS: the netns of skb->dev */
#define PR_CT_OPTS_SZ 16
#define PR_NF_ACCEPT 1
#define PR_IPPROTO_TCP 6
#define PR_IPPROTO_UDP 17

static __always_inline void flow_key(struct prism_flow_key *k, __u32 netns, const struct prg_hdrs *p)
{
	k->netns = netns;
	k->family = p->family;
	k->flow = p->flow;
	__builtin_memset(k->flow.pad, 0, sizeof(k->flow.pad));
}

/* PR_TC_INDEX_PROBE marks an HP frame prg_prism_vx handed to the normal path (every refusal of
 * the gate but "not TCP/UDP"). skb->tc_index survives IP forwarding, the bridge, every netfilter
 * hook, tc and the veth's crossing into the pod's namespace (skb_scrub_packet leaves it), and no
 * classifier of a current kernel reads it (see PRG_TC_INDEX_LEARN in common.h). A frame without
 * it (LP, prism's or the fast path's own redirects, anything the pod injects itself) is never
 * recorded, so a redirect can never vouch for the next one. */
#define PR_TC_INDEX_PROBE 0xfa59

/* refuse hands an HP frame of a TCP/UDP flow to the normal path, counted by reason, tagged so
 * that prg_prism_dlv records where (and whether) that path delivers it. */
static __always_inline int refuse(struct __sk_buff *ctx, __u32 reason)
{
	count(reason);
	ctx->tc_index = PR_TC_INDEX_PROBE;
	return 0;
}

/* accepted says whether an HP frame may skip the normal path (and with it every netfilter hook,
 * the bridge, tc and qdiscs on the way to the pod):
 * 1. conntrack in the VXLAN device's namespace (where flannel's FORWARD decides, and docker's
 *    bridged FORWARD through br_netfilter) holds a confirmed entry for the flow: only frames that
 *    passed FORWARD and reached POSTROUTING confirm one, so a SYN or first datagram that FORWARD
 *    drops leaves none; for TCP the reply must have been seen too (the handshake went through).
 *    A deleted or flushed entry sends the next frame to the normal path at once.
 * 2. the normal path delivered a frame of the flow to the pod within window_ns (at most 1 s):
 *    prg_prism_dlv, at the pod's own device, recorded it. Rules can change under an established
 *    flow, so once per verify_ns one frame of the flow takes the normal path instead; when
 *    anything on the way starts dropping those, the redirect stops window_ns after the last one
 *    delivered.
 * 3. that delivery went through the endpoint's own veth and carried the endpoint's MAC: the
 *    endpoint table (userspace's) never decides alone where a flow goes; the normal path's own
 *    routing, neighbour and FDB state does, and a table that disagrees sends the flow back to it.
 * 4. for TCP, the conntrack entry is liberal both ways (IP_CT_TCP_FLAG_BE_LIBERAL). Conntrack
 *    sees a redirected flow only on its re-verification frames and on what the pod sends back
 *    through the normal path, whose ack numbers then lie beyond the window conntrack knows:
 *    strict tracking calls those INVALID, and kube-proxy's KUBE-FORWARD (like most stateful
 *    firewalls) drops them, one retransmission timeout per exchange. So a flow otherwise accepted
 *    asks the agent (prg_prism_ask, at most every PR_ASK_EVERY_NS) to mark that one entry
 *    liberal and stays on the normal path until it is; every other connection of the node keeps
 *    strict tracking. Without the agent, HP TCP flows are never redirected.
 * Every refusal is counted by its reason; the frame then takes the normal path, never a drop. */
static __always_inline int accepted(struct __sk_buff *ctx, const struct prg_hdrs *p, __u32 netns,
				    const struct prism_cfg *cfg, const struct prism_ep *ep)
{
	__u8 proto = p->flow.proto;
	if (p->frag || !p->has_ports || (proto != PR_IPPROTO_TCP && proto != PR_IPPROTO_UDP)) {
		count(PR_ST_NOTCPUDP);
		return 0;
	}
	struct bpf_sock_tuple t = {};
	__u32 tsz;
	if (p->family == 4) {
		t.ipv4.saddr = p->flow.saddr[0];
		t.ipv4.daddr = p->flow.daddr[0];
		t.ipv4.sport = p->flow.sport;
		t.ipv4.dport = p->flow.dport;
		tsz = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, p->flow.saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, p->flow.daddr, 16);
		t.ipv6.sport = p->flow.sport;
		t.ipv6.dport = p->flow.dport;
		tsz = sizeof(t.ipv6);
	}
	struct bpf_ct_opts o = {.netns_id = PR_CURRENT_NETNS, .l4proto = proto};
	struct nf_conn *ct = bpf_skb_ct_lookup(ctx, &t, tsz, &o, PR_CT_OPTS_SZ);
	if (!ct)
		return refuse(ctx, PR_ST_NOCT);
	unsigned long status = ct->status;
	__u8 liberal = ct->proto.tcp.seen[0].flags & ct->proto.tcp.seen[1].flags & PR_CT_TCP_FLAG_BE_LIBERAL;
	bpf_ct_release(ct);
	if (!(status & IPS_CONFIRMED) || (proto == PR_IPPROTO_TCP && !(status & IPS_SEEN_REPLY)))
		return refuse(ctx, PR_ST_CTNEW);

	struct prism_flow_key k = {};
	flow_key(&k, netns, p);
	struct prism_acc *a = bpf_map_lookup_elem(&prg_prism_acc, &k);
	__u64 now = bpf_ktime_get_ns();
	if (!a || now - a->seen_ns > cfg->window_ns)
		return refuse(ctx, PR_ST_UNSEEN);
	if (a->ifindex != ep->ifindex || !mac_eq(a->mac, ep->ctr_mac))
		return refuse(ctx, PR_ST_ELSEWHERE);
	if (proto == PR_IPPROTO_TCP && !liberal) {
		if (now - a->ask_ns >= PR_ASK_EVERY_NS) {
			a->ask_ns = now;
			if (bpf_ringbuf_output(&prg_prism_ask, &k, sizeof(k), 0))
				count(PR_ST_ASKLOST);
		}
		return refuse(ctx, PR_ST_STRICT);
	}
	if (now - a->probe_ns >= cfg->verify_ns) {
		a->probe_ns = now;
		return refuse(ctx, PR_ST_PROBE);
	}
	return 1;
}

/* ---- prg_prism_dlv: the normal path's delivery, at the pod's own device ---- */

/* What userspace says about a pod's device (prg_prism_pod, keyed by the pod's end: its
 * namespace inode and ifindex): the endpoint domain its host end lives in and the host end's
 * ifindex, both from the host side's topology (the veth pair's peer link), never from the pod. */
struct prism_pod {
	__u32 domain;  /* netns inode of the VXLAN device (= the bridge-side veth's) */
	__u32 ifindex; /* the bridge-side veth, in that namespace */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PR_MAX_EPS);
	__type(key, struct prg_dev_key);
	__type(value, struct prism_pod);
} prg_prism_pod SEC(".maps");

/* record_delivery records that the normal path delivered ctx (a frame prg_prism_vx handed to it)
 * to the pod whose device runs this: the flow's time, the bridge-side veth it came through and
 * the destination MAC the normal path wrote. */
static __always_inline int record_delivery(struct __sk_buff *ctx)
{
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
	struct prg_dev_key dk = {};
	struct prg_hdrs h = {};
	struct prg_pkt pkt;
	int pr;

	ctx->tc_index = 0; /* given back: nothing after us sees the tag */
	if (!skb->dev)
		return PR_TCX_NEXT;
	prg_dev_key_of(skb->dev, &dk);
	struct prism_pod *pod = bpf_map_lookup_elem(&prg_prism_pod, &dk);
	if (!pod) {
		count(PR_ST_DLV_NOPOD);
		return PR_TCX_NEXT;
	}
	prg_pkt_tc(&pkt, ctx);
	PRG_TC_PARSE(pr, &pkt, ctx, prg_parse_frame(&pkt, 0, 0, &h));
	struct ethhdr *eth = prg_hdr(&pkt, 0, struct ethhdr);
	if (pr != PRG_OK || !eth || h.frag || !h.has_ports)
		return PR_TCX_NEXT;
	struct prism_flow_key k = {};
	flow_key(&k, pod->domain, &h);
	struct prism_acc v = {.ifindex = pod->ifindex};
	__builtin_memcpy(v.mac, eth->h_dest, sizeof(v.mac));
	v.seen_ns = bpf_ktime_get_ns();
	struct prism_acc *a = bpf_map_lookup_elem(&prg_prism_acc, &k);
	if (a) {
		v.probe_ns = a->probe_ns;
		v.ask_ns = a->ask_ns;
	} else {
		v.probe_ns = v.seen_ns; /* the flow's next frames need not re-verify at once */
	}
	bpf_map_update_elem(&prg_prism_acc, &k, &v, BPF_ANY);
	count(PR_ST_DLV);
	return PR_TCX_NEXT;
}

/* prg_prism_dlv runs at tcx ingress of each pod's eth0 (the pod's end of its veth), the far end
 * of the normal path: a frame here got past every netfilter hook (FORWARD, POSTROUTING, bridge
 * and netdev chains), the bridge, every tc program and qdisc on the host's veth, and the veth
 * itself. What happens after it (the pod's own stack and rules) happens to redirected frames
 * too, since bpf_redirect_peer enters the pod at this very point. It never changes a verdict. */
SEC("tcx/ingress")
int prg_prism_dlv(struct __sk_buff *ctx)
{
	if (ctx->tc_index != PR_TC_INDEX_PROBE)
		return PR_TCX_NEXT;
	return record_delivery(ctx);
}

/* prg_prism_dlvt is prg_prism_dlv for BPF_PROG_TEST_RUN, which cannot set tc_index: it takes
 * every frame as tagged. Never attached. */
SEC("tc")
int prg_prism_dlvt(struct __sk_buff *ctx)
{
	return record_delivery(ctx);
}

#endif /* PRG_PRISM_GATE_H */
