/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath6.h: IPv6 pods on the fast path (flannel layout, included by fastpath.bpf.c after
 * fastpath.h). A dual-stack pod's IPv6 flows to a pod on another node cross the same VXLAN
 * device as its IPv4 ones: IPv6 inside, the node's IPv4 underlay outside (the lab's --ipv6).
 * They are learned and replayed as the IPv4 flows are (see fastpath.bpf.c), in a table of their
 * own keyed by the 128-bit addresses, so the IPv4 hit path and its key stay as they were: each
 * program of the flannel layout looks at the (inner) EtherType once and hands an IPv6 frame to
 * the function here.
 *
 * What differs from IPv4:
 *  - the hop limit is the TTL (no header checksum to fix);
 *  - ingress decapsulation changes the frame's network protocol (IPv4 outside, IPv6 inside):
 *    bpf_skb_adjust_room's DECAP_L3_IPV6 sets skb->protocol, or the pod's stack would read the
 *    IPv6 header as IPv4; egress encapsulation sets it to IPv4 the same way (ENCAP_L3_IPV4);
 *  - any extension header (hop-by-hop, routing, a fragment) keeps the packet on the normal path
 *    (counted "opts" or "frag"), as IPv4 options do;
 *  - TCP and UDP only: ICMPv6 carries neighbour discovery and errors about other flows.
 * Services (a ClusterIP's DNAT) are on the fast path on the client's node as for IPv4, with the
 * 128-bit addresses in a side table: fastpath_nat6.h.
 * Same-node pods, Services among them included: fastpath_local6.h. Not (yet) on the fast path
 * for IPv6: the docker layout, BIG TCP. Such packets take the normal path, counted, and never
 * learn. Over
 * an IPv6 underlay (flannel's flannel-v6.1) both halves are fastpath_u6.h's: tx6 hands a flow
 * learned there (FP_F_U6) to tx_u6, and the underlay's programs hand IPv6 frames to rx_u6 and
 * lrn_u6.
 *
 * TCP FIN and RST go as IPv4's (fastpath.h's begin_out): the normal path's, but a short
 * connection's (FP_F_HSONLY, learned from its handshake) ride the fast path and hand the
 * connection to the agent (struct fp_closed6) to delete its conntrack entry.
 *
 * Entries go by their own sweep (prg_fastpath_sweep6, the lifetimes of fastpath.h) and count
 * against the local address's budget in prg_fastpath_pcnt under a key of their own (pcnt6_key).
 */
#ifndef PRG_FASTPATH6_H
#define PRG_FASTPATH6_H

#define FP_ETH_P_IPV6_BE 0xdd86 /* htons(ETH_P_IPV6) as a constant */
#define FP_IP6_HLEN 40
#define FP_MAX_FLOWS6 16384
/* prg_fastpath_pcnt keys of IPv6 addresses: this bit above the overlay, a fold of the address
 * below (two IPv6 addresses whose fold collides share a budget; IPv4 keys never have it). */
#define FP_PCNT6 (1ULL << 48)

struct fp_key6 {
	__u32 local[4]; /* the local pod's IPv6 (network order words) */
	__u32 remote[4];
	__u16 lport; /* network order */
	__u16 rport;
	__u8 proto;
	__u8 ovl;
	__u8 pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_FLOWS6);
	__type(key, struct fp_key6);
	__type(value, struct fp_flow);
} prg_fastpath_flow6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_sweep);
} prg_fastpath_sweep6 SEC(".maps");

/* The inner IPv6 packet, as far as the caches look at it. */
struct fp_pkt6 {
	struct ethhdr eth;
	__u32 saddr[4], daddr[4];
	__u16 sport, dport;
	__u8 proto, ttl, tos; /* hop limit, traffic class: named as fp_pkt's, for the shared helpers */
	__u8 hdrs; /* IPv6 + L4 header bytes (the MTU check of GSO segments) */
	__u8 ctl;  /* TCP: FP_TCP_* */
};

static __always_inline __u64 pcnt6_key(const struct fp_key6 *k)
{
	return FP_PCNT6 | ((__u64)k->ovl << 32) | (k->local[0] ^ k->local[1] ^ k->local[2] ^ k->local[3]);
}

/* fp_is_ip6 says whether the Ethernet frame at off carries IPv6 (off a constant). */
static __always_inline int fp_is_ip6(struct __sk_buff *ctx, __u32 off)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data + off;
	if ((void *)(eth + 1) > end) {
		__u16 proto;
		return !bpf_skb_load_bytes(ctx, off + 12, &proto, 2) && proto == FP_ETH_P_IPV6_BE;
	}
	return eth->h_proto == FP_ETH_P_IPV6_BE;
}

static __always_inline int parse6_at(const struct prg_pkt *pk, __u32 off, struct fp_pkt6 *p)
{
	struct prg_hdrs h = {};
	int r = prg_parse_frame(pk, off, 0, &h);
	if (r == PRG_SHORT)
		return PRG_SHORT;
	if (r != PRG_OK || h.family != 6)
		return FP_R_NOTIP; /* a longer extension chain than the parser walks, ... */
	struct ethhdr *eth = prg_hdr(pk, off, struct ethhdr);
	struct ipv6hdr *ip6 = prg_hdr(pk, h.l3_off, struct ipv6hdr);
	if (!eth || !ip6)
		return PRG_SHORT;
	__builtin_memcpy(&p->eth, eth, sizeof(p->eth));
	if (p->eth.h_dest[0] & 1)
		return FP_R_L2;
	if (h.frag)
		return FP_R_FRAG;
	if (h.l4_off - h.l3_off != FP_IP6_HLEN)
		return FP_R_OPTS; /* extension headers */
	__builtin_memcpy(p->saddr, h.flow.saddr, 16);
	__builtin_memcpy(p->daddr, h.flow.daddr, 16);
	p->proto = h.flow.proto;
	p->ttl = h.ttl;
	p->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
	p->sport = h.flow.sport;
	p->dport = h.flow.dport;
	p->ctl = 0;
	if (p->proto == PRG_IPPROTO_TCP) {
		__u8 *t = prg_at(pk, h.l4_off, 14);
		if (!t)
			return PRG_SHORT;
		p->ctl = t[13] & 0x07;
		p->hdrs = FP_IP6_HLEN + (t[12] >> 4) * 4;
		return 0;
	}
	if (p->proto == PRG_IPPROTO_UDP) {
		p->hdrs = FP_IP6_HLEN + 8;
		return 0;
	}
	return FP_R_PROTO;
}

static __always_inline int parse6(struct __sk_buff *ctx, __u32 off, struct fp_pkt6 *p)
{
	struct prg_pkt pk;
	int r;

	prg_pkt_tc(&pk, ctx);
	PRG_TC_PARSE(r, &pk, ctx, parse6_at(&pk, off, p));
	return r == PRG_SHORT ? FP_R_NOTIP : r;
}

static __always_inline void key6_out(struct fp_key6 *k, const struct fp_pkt6 *p)
{
	__builtin_memcpy(k->local, p->saddr, 16);
	__builtin_memcpy(k->remote, p->daddr, 16);
	k->lport = p->sport;
	k->rport = p->dport;
	k->proto = p->proto;
	k->ovl = fp_ovl;
}

static __always_inline void key6_in(struct fp_key6 *k, const struct fp_pkt6 *p)
{
	__builtin_memcpy(k->local, p->daddr, 16);
	__builtin_memcpy(k->remote, p->saddr, 16);
	k->lport = p->dport;
	k->rport = p->sport;
	k->proto = p->proto;
	k->ovl = fp_ovl;
}

#include "fastpath_nat6.h"

/* sweep_one6 is sweep_entry (fastpath.h) for the IPv6 table. */
static long sweep_one6(struct bpf_map *map, struct fp_key6 *k, struct fp_flow *f, __u64 *now)
{
	return sweep_entry(map, k, f, *now, pcnt6_key(k));
}

static int sweep6(void *map, __u32 *key, struct fp_sweep *s)
{
	__u64 now = bpf_ktime_get_ns();
	bpf_for_each_map_elem(&prg_fastpath_flow6, sweep_one6, &now, 0);
	nat6_sweep(); /* the side entries of the entries gone (fastpath_nat6.h) */
	bpf_timer_start(&s->t, FP_SWEEP_NS, 0);
	return 0;
}

/* flow_new6 is flow_insert (fastpath.h) for the IPv6 table. */
static __always_inline struct fp_flow *flow_new6(const struct fp_cfg *cfg, struct fp_key6 *k, struct fp_flow *nf,
						 __u32 dir)
{
	int fresh;
	struct fp_flow *f = flow_insert(&prg_fastpath_flow6, cfg, k, pcnt6_key(k), nf, dir, &fresh);
	if (fresh)
		sweep_arm_at(&prg_fastpath_sweep6, sweep6);
	return f;
}

static __always_inline int pod_lookup6(__u32 netns, const __u32 *addr, struct prg_pod **out);

/* src_refused6 is src_refused (fastpath.h) for an IPv6 source. */
static __always_inline __u32 src_refused6(struct __sk_buff *ctx, const struct fp_cfg *cfg, const struct fp_flow *f,
					  const __u32 *saddr)
{
	__u32 ifindex = ctx->ifindex;
	asm volatile("" : "+r"(ifindex)); /* as src_refused */
	if (f && f->out_ifindex == ifindex)
		return 0;
	struct prg_pod *pod = NULL;
	int r = pod_lookup6(cfg->netns, saddr, &pod);
	return src_owner(ifindex, r, pod);
}

static __always_inline int handover_out6_src(struct fp_flow *f, struct fp_key6 *k, const struct fp_pkt6 *p,
					     struct __sk_buff *ctx, const struct fp_cfg *cfg, __u32 reason);

/* handover_out6 is handover_out (fastpath.h) for IPv6, its source checked as there. */
static __always_inline int handover_out6(struct fp_flow *f, struct fp_key6 *k, const struct fp_pkt6 *p,
					 struct __sk_buff *ctx, const struct fp_cfg *cfg, __u32 reason)
{
	__u32 sr = src_refused6(ctx, cfg, f, p->saddr);
	if (sr)
		return refuse_out(ctx, sr);
	return handover_out6_src(f, k, p, ctx, cfg, reason);
}

static __always_inline int handover_out6_src(struct fp_flow *f, struct fp_key6 *k, const struct fp_pkt6 *p,
					     struct __sk_buff *ctx, const struct fp_cfg *cfg, __u32 reason)
{
	if (f) {
		seen_out(f, cfg->gen, p->ttl, ctx->ifindex);
	} else {
		struct fp_flow nf = {.out_ttl_seen = p->ttl, .out_ifindex = ctx->ifindex};
		if (!flow_new6(cfg, k, &nf, FP_DIR_TX)) {
			/* Over budget or the table full: nothing to learn, as handover_out_src says
			 * (FP_TC_INDEX_NOOUT), so the learners look nothing up for it. */
			if (!ctx->tc_index)
				ctx->tc_index = FP_TC_INDEX_NOOUT;
			count(FP_DIR_TX, reason);
			return TCX_NEXT;
		}
	}
	count(FP_DIR_TX, nat6_handover(ctx, f, k, p, reason)); /* fastpath_nat6.h */
	return TCX_NEXT;
}

static __always_inline int handover_in6(struct __sk_buff *ctx, struct fp_flow *f, struct fp_key6 *k,
					const struct fp_pkt6 *p, const struct fp_cfg *cfg, __u32 vtep, __u32 reason)
{
	if (!ctx->tc_index)
		ctx->tc_index = PRG_TC_INDEX_LEARN;
	if (f) {
		seen_in(f, cfg->gen, p->ttl);
	} else {
		struct fp_flow nf = {.in_ttl_seen = p->ttl, .vtep = vtep};
		flow_new6(cfg, k, &nf, FP_DIR_RX);
	}
	count(FP_DIR_RX, reason);
	return TCX_NEXT;
}

/* One closed IPv6 connection for the agent (fastpath_closed.h's ring): fp_closed with 128-bit
 * addresses. A record of its own, not a family field in fp_closed, so the IPv4 record (and the
 * agent's reading of it) stays as it was; the ring's records carry their length, which tells
 * the two apart. */
struct fp_closed6 {
	__u32 local[4]; /* network order, as fp_key6 */
	__u32 remote[4];
	__u16 lport;
	__u16 rport;
	__u8 proto;
	__u8 ovl;
	__u8 pad[2];
	__u64 ns;
};

/* tuple6: IPv6 flow k's key as conntrack's tuple (either way). */
static __always_inline void tuple6(struct bpf_sock_tuple *t, const struct fp_key6 *k)
{
	__builtin_memset(t, 0, sizeof(*t));
	__builtin_memcpy(t->ipv6.saddr, k->local, 16);
	__builtin_memcpy(t->ipv6.daddr, k->remote, 16);
	t->ipv6.sport = k->lport;
	t->ipv6.dport = k->rport;
}

/* ct_known6: ct_known (fastpath_closed.h) for IPv6 flow k's connection. */
static __always_inline int ct_known6(struct __sk_buff *ctx, const struct fp_key6 *k)
{
	struct bpf_sock_tuple t;
	tuple6(&t, k);
	return ct_known(ctx, &t, sizeof(t.ipv6), k->proto);
}

/* closed_push6 is closed_push for an IPv6 flow. */
static __always_inline void closed_push6(struct __sk_buff *ctx, const struct fp_key6 *k, __u32 old, __u32 fin,
					 __u32 dir)
{
	if (!closed_due(old, fin, k->proto))
		return;
	struct bpf_sock_tuple t;
	tuple6(&t, k);
	if (closed_expire(ctx, &t, sizeof(t.ipv6), k->proto)) {
		count(dir, FP_R_CLOSED_CT);
		return;
	}
	struct fp_closed6 c = {.lport = k->lport, .rport = k->rport, .proto = k->proto, .ovl = k->ovl,
			       .ns = bpf_ktime_get_ns()};
	__builtin_memcpy(c.local, k->local, 16);
	__builtin_memcpy(c.remote, k->remote, 16);
	if (bpf_ringbuf_output(&prg_fastpath_closed, &c, sizeof(c), 0))
		count(dir, FP_R_CLOSED_LOST);
}

/* closing6 is closing (fastpath.h) for the IPv6 table. */
static __always_inline void closing6(struct __sk_buff *ctx, struct fp_key6 *k, __u32 fin, __u32 dir)
{
	__u32 old;
	if (closing_mark(bpf_map_lookup_elem(&prg_fastpath_flow6, k), fin, &old))
		closed_push6(ctx, k, old, fin, dir);
}

/* fin_fast6 is fin_fast (fastpath.h) for the IPv6 table. */
static __always_inline int fin_fast6(struct fp_key6 *k)
{
	return fin_fast_flow(bpf_map_lookup_elem(&prg_fastpath_flow6, k));
}

static __always_inline struct fp_flow *lookup6(struct fp_key6 *k, int out, __u32 need, __u32 gen, __u32 *reason)
{
	return lookup_flow(bpf_map_lookup_elem(&prg_fastpath_flow6, k), out, need, gen, reason);
}

/* pod_lookup6 is prg_pod_lookup4 (pod.h) for an IPv6 pod address. */
static __always_inline int pod_lookup6(__u32 netns, const __u32 *addr, struct prg_pod **out)
{
	struct prg_pod_key k = {.netns = netns, .family = 6};
	__builtin_memcpy(k.addr, addr, 16);
	struct prg_pod *p = bpf_map_lookup_elem(&prg_fastpath_ep, &k);
	if (!p)
		return PRG_POD_MISS;
	if (p->flags & PRG_POD_F_GONE)
		return PRG_POD_GONE;
	__u32 slot = p->slot;
	struct bpf_devmap_val *v = bpf_map_lookup_elem(&prg_fastpath_port, &slot);
	if (!v || v->ifindex != p->ifindex)
		return PRG_POD_STALE;
	*out = p;
	return PRG_POD_OK;
}

/* fastpath_u6.h: the sending half over an IPv6 underlay. */
static __attribute__((noinline)) int tx_u6(struct __sk_buff *ctx, struct fp_flow *f, const struct fp_key6 *k,
					    const struct fp_cfg *cfg);

#include "fastpath_local6.h"

/* tx6: prg_fastpath_tx for an IPv6 frame leaving a pod. */
static __always_inline int tx6(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg = fp_config();
	struct fp_key6 k = {};
	struct fp_pkt6 p;
	__u32 r;

	if (!cfg)
		return TCX_NEXT;
	if (ctx->len > FP_IP_MAX + sizeof(struct ethhdr)) {
		count(FP_DIR_TX, FP_R_BIG);
		return TCX_NEXT;
	}
	r = parse6(ctx, 0, &p);
	if (r) {
		count(FP_DIR_TX, r);
		return TCX_NEXT;
	}
	key6_out(&k, &p);
	if (p.ctl) {
		struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
		if (p.ctl == FP_TCP_SYN) { /* learned from the normal path, as for IPv4 */
			__u32 sr = src_refused6(ctx, cfg, f, p.saddr); /* before it reopens the flow */
			if (sr)
				return refuse_out(ctx, sr);
			syn_open(f);
			local_syn(f);
			return handover_out6_src(f, &k, &p, ctx, cfg, FP_R_PROTO);
		}
		if (f) { /* a forged FIN or RST would close another pod's flow */
			__u32 sr = src_refused6(ctx, cfg, f, p.saddr);
			if (sr)
				return refuse_out(ctx, sr);
		}
		closing6(ctx, &k, p.ctl & FP_TCP_RST ? FP_F_DONE : FP_F_FIN_OUT, FP_DIR_TX);
		if (!fin_fast6(&k)) {
			count(FP_DIR_TX, FP_R_PROTO);
			return TCX_NEXT;
		}
		/* A short connection's FIN or RST: on the fast path like its data (FP_F_HSONLY). */
	}
	struct fp_flow *f = lookup6(&k, 1, FP_F_OUT | FP_F_IN, cfg->gen, &r);
	if (r == FP_R_STALE && f && (f->flags & FP_F_SNAT))
		r = local_reply_due6(ctx, f, &k, &p); /* fastpath_local6.h */
	if (r != FP_R_HIT)
		return handover_out6(f, &k, &p, ctx, cfg, r);
	if (!f)
		return TCX_NEXT;
	if (f->out_ifindex != ctx->ifindex)
		return handover_out6(f, &k, &p, ctx, cfg, FP_R_STALE);
	if ((cfg->flags & FP_C_UNSUP) || ctx->mark) {
		count(FP_DIR_TX, FP_R_UNSUP);
		return TCX_NEXT;
	}
	if (p.ttl <= f->out_ttl_dec) /* the normal path sends the ICMP error, or re-learns the change */
		return handover_out6(f, &k, &p, ctx, cfg, FP_R_TTL);
	if (f->flags & FP_F_LOCAL) /* to a pod on this node: fastpath_local6.h */
		return local_tx6(ctx, cfg, f, &k, &p);
	if (f->flags & FP_F_U6) /* learned over the IPv6 underlay: the VXLAN device encapsulates */
		return tx_u6(ctx, f, &k, cfg);
	__u32 wire = ctx->gso_size ? ctx->gso_size + p.hdrs + FP_ENCAP_LEN : ctx->len - sizeof(struct ethhdr) + FP_ENCAP_LEN;
	if (wire > cfg->mtu) {
		count(FP_DIR_TX, FP_R_MTU);
		return TCX_NEXT;
	}
	if (f->flags & FP_F_DNAT) { /* a Service's translation, as conntrack applied it (fastpath_nat6.h) */
		int nr = nat6_out(ctx, &k, &p);
		if (nr == 2)
			return handover_out6(f, &k, &p, ctx, cfg, FP_R_STALE);
		if (nr > 0) {
			count(FP_DIR_TX, FP_R_ERR);
			return TCX_NEXT;
		}
		if (nr < 0)
			goto drop;
	}
	/* As prg_fastpath_tx: outer UDP checksum 0, source port from the packet's hash. The
	 * ENCAP_L3_IPV4 flag also makes the frame's protocol IPv4, as the outer header is. */
	__u32 hash = ctx->hash;
	__u32 olen = ctx->len + FP_ENCAP_LEN - sizeof(struct ethhdr);
	__u16 id = bpf_get_prandom_u32();
	__u8 dec = f->out_ttl_dec;

	if (bpf_skb_adjust_room(ctx, FP_ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
					BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
					FP_ADJ_ROOM_ENCAP_L2(sizeof(struct ethhdr)))) {
		count(FP_DIR_TX, FP_R_ERR);
		return TCX_NEXT;
	}
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + FP_TMPL_LEN + FP_IP6_HLEN > end) {
		if (bpf_skb_pull_data(ctx, FP_TMPL_LEN + FP_IP6_HLEN))
			goto drop;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + FP_TMPL_LEN + FP_IP6_HLEN > end)
			goto drop;
	}
	__builtin_memcpy(data, f->tmpl, FP_TMPL_LEN);
	struct iphdr *oip = data + sizeof(struct ethhdr);
	struct udphdr *oudp = (void *)(oip + 1);
	oip->tot_len = bpf_htons(olen);
	oip->id = id;
	/* ip_tunnel_ecn_encap: the outer ECN field follows the inner traffic class's. */
	oip->tos = (oip->tos & ~3) | ((p.tos & 3) == 3 ? 2 : (p.tos & 3));
	oip->check = 0;
	oip->check = ip_csum(oip);
	if (hash) {
		hash ^= hash << 16;
		oudp->source = bpf_htons((__u16)((((__u64)hash) * (__u32)(cfg->port_max - cfg->port_min)) >> 32) +
					 cfg->port_min);
	}
	oudp->len = bpf_htons(olen - sizeof(struct iphdr));
	oudp->check = 0;
	struct ipv6hdr *ip6 = data + FP_TMPL_LEN;
	ip6->hop_limit -= dec;
	ctx->mark = FP_MARK;
	count(FP_DIR_TX, FP_R_HIT);
	return bpf_redirect(cfg->underlay, 0);
drop:
	count(FP_DIR_TX, FP_R_DROP);
	return TC_ACT_SHOT;
}

/* rx6: prg_fastpath_rx for a VXLAN frame of our overlay (outer headers checked: o) whose inner
 * frame is IPv6. */
static __always_inline int rx6(struct __sk_buff *ctx, __u32 vtep)
{
	struct fp_cfg *cfg = fp_config();
	struct fp_key6 k = {};
	struct fp_pkt6 p;
	__u32 r;

	if (!cfg)
		return TCX_NEXT;
	r = parse6(ctx, FP_TMPL_LEN - sizeof(struct ethhdr), &p);
	if (r) {
		count(FP_DIR_RX, r);
		return TCX_NEXT;
	}
	key6_in(&k, &p);
	/* A Service backend's reply: from here on k is the pod's flow, by the Service address, and
	 * be the backend (fastpath_nat6.h). */
	struct fp_nat6 be = {};
	int svc = nat6_in(&k, &be);
	if (svc > 1) {
		count(FP_DIR_RX, svc);
		return TCX_NEXT;
	}
	if (p.ctl) {
		if (p.ctl == FP_TCP_SYN) {
			struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
			syn_open(f);
			return handover_in6(ctx, f, &k, &p, cfg, vtep, FP_R_PROTO);
		}
		closing6(ctx, &k, p.ctl & FP_TCP_RST ? FP_F_DONE : FP_F_FIN_IN, FP_DIR_RX);
		if (!fin_fast6(&k)) {
			count(FP_DIR_RX, FP_R_PROTO);
			return TCX_NEXT;
		}
	}
	__u32 need = cfg->flags & FP_C_ONEWAY ? FP_F_IN : FP_F_OUT | FP_F_IN;
	struct fp_flow *f = lookup6(&k, 0, need, cfg->gen, &r);
	if (svc) {
		if (!nat6_reply_ok(&k, f, &be)) { /* no longer translated to this backend: relearn */
			count(FP_DIR_RX, FP_R_STALE);
			return TCX_NEXT;
		}
		/* As begin_in (fastpath.h): a reply is re-learned after the egress direction was. */
		if (r == FP_R_STALE && bpf_ktime_get_coarse_ns() - f->in_ns <= 2 * FP_REVALIDATE_NS &&
		    (f->out_ns <= f->in_ns || !ct_known6(ctx, &k)))
			r = FP_R_HIT;
	}
	if (r != FP_R_HIT)
		return handover_in6(ctx, f, &k, &p, cfg, vtep, r);
	if (!f)
		return TCX_NEXT;
	if ((cfg->flags & FP_C_ROUTED) && !mac_eq(p.eth.h_dest, cfg->vx_mac)) {
		count(FP_DIR_RX, FP_R_L2);
		return TCX_NEXT;
	}
	if (f->vtep != vtep)
		return handover_in6(ctx, f, &k, &p, cfg, vtep, FP_R_STALE);
	struct prg_pod *pod = NULL;
	int pr = pod_lookup6(cfg->netns, p.daddr, &pod);
	if (pr == PRG_POD_MISS || !pod) {
		count(FP_DIR_RX, FP_R_NOPOD);
		return TCX_NEXT;
	}
	if (pr != PRG_POD_OK || pod->ifindex != f->in_ifindex || !mac_eq(pod->ctr_mac, f->in_mac))
		return handover_in6(ctx, f, &k, &p, cfg, vtep, FP_R_STALE);
	if (p.ttl <= f->in_ttl_dec) /* the normal path sends the ICMP error, or re-learns the change */
		return handover_in6(ctx, f, &k, &p, cfg, vtep, FP_R_TTL);
	/* The reply's source back to the Service address (k.remote: nat6_in), as conntrack reverses
	 * the DNAT, before decapsulation: a failure leaves the frame as it came. */
	if (svc) {
		int nr = nat6_rewrite(ctx, FP_TMPL_LEN, 8, 0, p.proto, p.saddr, k.remote, p.sport, k.rport);
		if (nr > 0) {
			count(FP_DIR_RX, FP_R_ERR);
			return TCX_NEXT;
		}
		if (nr < 0)
			goto drop;
	}
	__u8 dec = f->in_ttl_dec;
	if (bpf_skb_adjust_room(ctx, -FP_ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_NO_CSUM_RESET | BPF_F_ADJ_ROOM_DECAP_L3_IPV6)) {
		count(FP_DIR_RX, FP_R_ERR);
		return TCX_NEXT;
	}
	if (bpf_csum_level(ctx, BPF_CSUM_LEVEL_QUERY) >= 0)
		bpf_csum_level(ctx, BPF_CSUM_LEVEL_DEC);
	/* The frame kept the outer Ethernet header (EtherType IPv4): it now carries IPv6. */
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end) {
		if (bpf_skb_pull_data(ctx, sizeof(struct ethhdr) + FP_IP6_HLEN))
			goto drop;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end)
			goto drop;
	}
	((struct ethhdr *)data)->h_proto = FP_ETH_P_IPV6_BE;
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	ip6->hop_limit -= dec;
	long v = prg_pod_deliver(ctx, f->in_mac, f->in_mac + 6, pod->ifindex);
	if (v < 0)
		goto drop;
	count(FP_DIR_RX, FP_R_HIT);
	return v;
drop:
	count(FP_DIR_RX, FP_R_DROP);
	return TC_ACT_SHOT;
}

/* lrn_tx6: prg_fastpath_lrn_tx for a VXLAN frame from this VTEP (to vtep) whose inner frame is
 * IPv6: the template of a flow tx6 handed over. */
static __always_inline int lrn_tx6(struct __sk_buff *ctx, __u32 vtep, int handed)
{
	struct fp_key6 k = {};
	struct fp_pkt6 p;

	if (parse6(ctx, FP_TMPL_LEN - sizeof(struct ethhdr), &p) || (p.ctl & (FP_TCP_FIN | FP_TCP_RST)))
		return TCX_NEXT;
	key6_out(&k, &p);
	/* The flow handed over, or the one a Service translated to k (fastpath_nat6.h). */
	struct fp_flow *f = nat6_learn_out(ctx, &k, &p, vtep, handed);
	if (!f)
		return TCX_NEXT;
	local_forget(f); /* it left this node: an overlay template again */
	if (bpf_skb_load_bytes(ctx, 0, f->tmpl, sizeof(f->tmpl)))
		return TCX_NEXT;
	if (f->flags & FP_F_U6) /* it moved from the IPv6 underlay: a whole template again */
		__sync_fetch_and_and(&f->flags, ~FP_F_U6);
	learned_out(f, vtep, p.ttl, p.proto, p.ctl);
	learned_report(&k, sizeof(k), f, p.proto, 1, 0);
	return TCX_NEXT;
}

/* lrn_rx6: prg_fastpath_lrn_rx for an IPv6 frame the normal path delivers to a pod (handed:
 * tagged by handover_out6 at a local pod's veth). */
static __attribute__((noinline)) int lrn_rx6(struct __sk_buff *ctx, const struct fp_cfg *cfg, int handed)
{
	struct fp_key6 k = {};
	struct fp_pkt6 p;

	if (parse6(ctx, 0, &p) || (p.ctl & (FP_TCP_FIN | FP_TCP_RST)))
		return TCX_NEXT;
	local_learn6(ctx, cfg, &p, handed); /* same node: fastpath_local6.h */
	key6_in(&k, &p);
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
	if (!f || !f->in_ttl_seen || f->in_ttl_seen < p.ttl)
		return TCX_NEXT;
	__u32 was = f->flags;
	learned_in(f, &p.eth, ctx->ifindex, p.ttl, p.proto, p.ctl);
	learned_report(&k, sizeof(k), f, p.proto, 0, was);
	return TCX_NEXT;
}

#endif
