/* SPDX-License-Identifier: GPL-2.0 */
/*
 * prism's firewall gate, included by prism.bpf.c after its maps, count() and classify():
 * accepted() decides whether an HP frame may skip the normal path, and prg_prism_fwd (a netfilter
 * program at the end of FORWARD) records the flows the normal path accepted. Split out of
 * prism.bpf.c to keep each file readable; it is not a header for other programs.
 */
#ifndef PRG_PRISM_GATE_H
#define PRG_PRISM_GATE_H

/* A flow toward a local container, as both programs key it (prg_prism_acc). */
struct prism_flow_key {
	__u32 netns;  /* netns inode of the VXLAN device, where FORWARD decides */
	__u32 family; /* 4 or 6 */
	struct prg_flow flow;
};

struct prism_acc {
	__u64 seen_ns;  /* last time prg_prism_fwd saw a frame of the flow past FORWARD */
	__u64 probe_ns; /* last time prg_prism_vx sent one of its frames through the normal path */
};

/* Flows the normal path forwarded recently, written by prg_prism_fwd (after FORWARD). */
#define PR_MAX_FLOWS 65536
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PR_MAX_FLOWS);
	__type(key, struct prism_flow_key);
	__type(value, struct prism_acc);
} prg_prism_acc SEC(".maps");

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;
extern int bpf_dynptr_from_skb(struct __sk_buff *skb, __u64 flags, struct bpf_dynptr *ptr__uninit) __ksym;
extern void *bpf_dynptr_slice(const struct bpf_dynptr *ptr, __u32 offset, void *buffer, __u32 buffer__szk) __ksym;

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

/* accepted says whether an HP frame may skip the normal path (and with it the FORWARD chain):
 * 1. conntrack in the VXLAN device's namespace (where flannel's FORWARD decides, and docker's
 *    bridged FORWARD through br_netfilter) holds a confirmed entry for the flow: only frames that
 *    passed FORWARD and reached POSTROUTING confirm one, so a SYN or first datagram that FORWARD
 *    drops leaves none; for TCP the reply must have been seen too (the handshake went through).
 *    A deleted or flushed entry sends the next frame to the normal path at once.
 * 2. prg_prism_fwd saw a frame of the flow past FORWARD within window_ns: conntrack keeps an
 *    established entry when a new rule drops the flow, so once per verify_ns one frame of the
 *    flow takes the normal path instead; when FORWARD starts dropping those, the redirect stops
 *    window_ns after the last one it let through.
 * Every refusal is counted by its reason; the frame then takes the normal path, never a drop. */
static __always_inline int accepted(struct __sk_buff *ctx, const struct prg_hdrs *p, __u32 netns,
				    const struct prism_cfg *cfg)
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
	if (!ct) {
		count(PR_ST_NOCT);
		return 0;
	}
	unsigned long status = ct->status;
	bpf_ct_release(ct);
	if (!(status & IPS_CONFIRMED) || (proto == PR_IPPROTO_TCP && !(status & IPS_SEEN_REPLY))) {
		count(PR_ST_CTNEW);
		return 0;
	}

	struct prism_flow_key k = {};
	flow_key(&k, netns, p);
	struct prism_acc *a = bpf_map_lookup_elem(&prg_prism_acc, &k);
	__u64 now = bpf_ktime_get_ns();
	if (!a || now - a->seen_ns > cfg->window_ns) {
		count(PR_ST_UNSEEN);
		return 0;
	}
	if (now - a->probe_ns >= cfg->verify_ns) {
		a->probe_ns = now;
		count(PR_ST_PROBE);
		return 0;
	}
	return 1;
}

/* ---- prg_prism_fwd: the normal path's verdict, at the end of FORWARD ---- */

/* prg_prism_fwd is a netfilter program at NF_INET_FORWARD with the last priority, in each
 * namespace of a VXLAN device (IPv4 and IPv6; docker's bridged frames reach it through
 * br_netfilter): a frame it sees was accepted by every FORWARD rule before it. For HP flows
 * toward a local container it records the time in prg_prism_acc, which prg_prism_vx's gate
 * reads. It never changes a verdict. */
SEC("netfilter")
int prg_prism_fwd(struct bpf_nf_ctx *ctx)
{
	const struct nf_hook_state *st = ctx->state;
	struct pr_match m = {.hit = -1};
	struct bpf_dynptr d;
	__u8 hbuf[sizeof(struct ipv6hdr)];
	__u16 pbuf[2];
	__u32 l4;

	if (bpf_dynptr_from_skb((struct __sk_buff *)ctx->skb, 0, &d))
		return PR_NF_ACCEPT;
	if (st->pf == NFPROTO_IPV4) {
		struct iphdr *ip = bpf_dynptr_slice(&d, 0, hbuf, sizeof(struct iphdr));
		if (!ip || ip->ihl < 5 || (ip->frag_off & bpf_htons(0x3fff)))
			return PR_NF_ACCEPT;
		m.p.family = 4;
		m.p.flow.proto = ip->protocol;
		m.p.flow.saddr[0] = ip->saddr;
		m.p.flow.daddr[0] = ip->daddr;
		m.p.dscp = ip->tos >> 2;
		l4 = ip->ihl * 4;
	} else if (st->pf == NFPROTO_IPV6) {
		struct ipv6hdr *ip6 = bpf_dynptr_slice(&d, 0, hbuf, sizeof(struct ipv6hdr));
		if (!ip6)
			return PR_NF_ACCEPT;
		m.p.family = 6;
		m.p.flow.proto = ip6->nexthdr; /* extension headers: not TCP/UDP here, so not recorded */
		__builtin_memcpy(m.p.flow.saddr, &ip6->saddr, 16);
		__builtin_memcpy(m.p.flow.daddr, &ip6->daddr, 16);
		m.p.dscp = ((ip6->priority << 4) | (ip6->flow_lbl[0] >> 4)) >> 2;
		l4 = sizeof(struct ipv6hdr);
	} else {
		return PR_NF_ACCEPT;
	}
	if (m.p.flow.proto != PR_IPPROTO_TCP && m.p.flow.proto != PR_IPPROTO_UDP)
		return PR_NF_ACCEPT;
	__u16 *ports = bpf_dynptr_slice(&d, l4, pbuf, sizeof(pbuf));
	if (!ports)
		return PR_NF_ACCEPT;
	m.p.flow.sport = ports[0];
	m.p.flow.dport = ports[1];
	m.p.has_ports = 1;

	/* A device's namespace is the hook's: state->net, which a test run leaves unset (and sets
	 * only out, whatever the hook). */
	struct net_device *nd = st->in ? st->in : st->out;
	if (!nd)
		return PR_NF_ACCEPT;
	__u32 netns = nd->nd_net.net->ns.inum;
	struct prism_ep_key ek = {.netns = netns, .family = m.p.family};
	__builtin_memcpy(ek.addr, m.p.flow.daddr, sizeof(ek.addr));
	if (!bpf_map_lookup_elem(&prg_prism_ep, &ek))
		return PR_NF_ACCEPT; /* not toward a container prism serves */
	classify(&m);
	if (m.hit < 0)
		return PR_NF_ACCEPT;
	struct prism_flow_key k = {};
	flow_key(&k, netns, &m.p);
	__u64 now = bpf_ktime_get_ns();
	struct prism_acc *a = bpf_map_lookup_elem(&prg_prism_acc, &k);
	if (a) {
		a->seen_ns = now;
	} else {
		/* probe_ns = now: the flow's next frames need not re-verify at once. */
		struct prism_acc v = {.seen_ns = now, .probe_ns = now};
		bpf_map_update_elem(&prg_prism_acc, &k, &v, BPF_NOEXIST);
	}
	count(PR_ST_FWD);
	return PR_NF_ACCEPT;
}

#endif /* PRG_PRISM_GATE_H */
