/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath_u6.h: the receiving half of the fast path over an IPv6 underlay (real flannel's
 * dual-stack layout: flannel-v6.1, VXLAN over the nodes' IPv6 addresses, beside flannel.1).
 * Included by fastpath.bpf.c after fastpath6.h.
 *
 * Only the receiver: a kernel sender (the normal path's flannel-v6.1) puts a valid outer UDP
 * checksum on every frame, so tc ingress on the underlay can strip outer IPv6 + UDP + VXLAN
 * (and the inner Ethernet header) of a learned flow and redirect the inner IPv6 packet to the
 * pod, as rx6 does over the IPv4 underlay. The sender stays on the normal path: tc cannot ask
 * for per-segment outer UDP checksums on GSO packets (bpf_skb_adjust_room sets
 * SKB_GSO_UDP_TUNNEL, never _CSUM), and a zero checksum over IPv6 is dropped by a receiving
 * device without udp6zerocsumrx. So a flow is served on receive once learned inbound (FP_F_IN)
 * alone, as FP_C_ONEWAY does for every flow.
 *
 * The remote VTEP is 128 bits and fp_flow.vtep 32: the layouts of pinned maps stay as they were
 * and the remote VTEP lives in a side table, prg_fastpath_vtep6, keyed by the flow's key. It is
 * written on the underlay's egress (lrn_u6: where the kernel sends the flow's own packets, the
 * analog of learned_out's vtep), never from a received frame, so a forged outer source cannot
 * plant itself. The local VTEP and the device's MAC come from the agent (prg_fastpath_u6cfg).
 *
 * What falls back to the normal path: an outer extension header (FP_R_OPTS) or fragment
 * (FP_R_FRAG), another UDP port or VNI, a zero outer checksum (the device would drop it: so
 * does the normal path), an outer source other than the flow's VTEP (FP_R_STALE), Service
 * replies (the reverse DNAT of fastpath_nat6.h is not done here), an inner IPv4 frame.
 */
#ifndef PRG_FASTPATH_U6_H
#define PRG_FASTPATH_U6_H

#define FP_U6_INNER 70 /* outer Ethernet 14 + IPv6 40 + UDP 8 + VXLAN 8: the inner Ethernet header */
#define FP_U6_ENCAP 70 /* what decapsulation takes: outer IPv6 40 + UDP 8 + VXLAN 8 + inner Ethernet 14 */

struct fp_u6cfg {
	__u32 vtep[4]; /* the local VTEP: the underlay's IPv6 address flannel-v6.1 sends from (0: off) */
	__u8 vx_mac[6]; /* flannel-v6.1's MAC (a routed device only accepts frames to it) */
	__u8 pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_u6cfg);
} prg_fastpath_u6cfg SEC(".maps");

struct fp_vtep6 {
	__u32 addr[4];
};

/* LRU: no sweep needed; an entry without its flow is never read (the flow is looked up first). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FP_MAX_FLOWS6);
	__type(key, struct fp_key6);
	__type(value, struct fp_vtep6);
} prg_fastpath_vtep6 SEC(".maps");

static __always_inline int a6_eq(const __u32 *a, const __u32 *b)
{
	return !((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]));
}

struct fp_outer6 {
	__u32 saddr[4], daddr[4];
	__u8 vxlan;  /* VXLAN of our port and VNI, flags exactly I, no extension header, checksum set */
	__u8 reason; /* otherwise why not */
};

static __always_inline int outer6_at(const struct prg_pkt *pk, const struct fp_cfg *cfg, struct fp_outer6 *o)
{
	struct prg_hdrs h = {};
	struct prg_vxlan vx;
	int r = prg_parse_frame(pk, 0, 0, &h);
	o->reason = FP_R_OTHER;
	if (r == PRG_SHORT)
		return r;
	if (r != PRG_OK || h.family != 6)
		return PRG_OK;
	__builtin_memcpy(o->saddr, h.flow.saddr, 16);
	__builtin_memcpy(o->daddr, h.flow.daddr, 16);
	if (h.frag) {
		o->reason = FP_R_FRAG;
		return PRG_OK;
	}
	if (h.flow.proto == PRG_IPPROTO_UDP && h.l4_off - h.l3_off != FP_IP6_HLEN) {
		o->reason = FP_R_OPTS;
		return PRG_OK;
	}
	if (h.l4_off != sizeof(struct ethhdr) + FP_IP6_HLEN)
		return PRG_OK;
	r = prg_vxlan_of(pk, &h, cfg->vxlan_ports, &vx);
	if (r != PRG_OK)
		return r == PRG_SHORT ? r : PRG_OK;
	struct udphdr *udp = prg_at(pk, h.l4_off, sizeof(struct udphdr));
	__u32 *hdr = prg_at(pk, h.l4_off + sizeof(struct udphdr), PRG_VXLAN_HLEN);
	if (!udp || !hdr)
		return PRG_SHORT;
	/* Never a zero checksum: the device (no udp6zerocsumrx) drops such a frame, so must we. */
	if (!udp->check)
		return PRG_OK;
	if (hdr[0] != bpf_htonl(0x08000000) || vx.vni != cfg->vni || hdr[1] & bpf_htonl(0xff))
		return PRG_OK;
	o->vxlan = 1;
	return PRG_OK;
}

static __attribute__((noinline)) void outer6(struct __sk_buff *ctx, const struct fp_cfg *cfg, struct fp_outer6 *o)
{
	struct prg_pkt pk;
	int r;

	prg_pkt_tc(&pk, ctx);
	PRG_TC_PARSE(r, &pk, ctx, outer6_at(&pk, cfg, o));
	if (r != PRG_OK)
		o->vxlan = 0;
}

static __always_inline struct fp_u6cfg *u6_config(void)
{
	__u32 z = 0;
	struct fp_u6cfg *u = bpf_map_lookup_elem(&prg_fastpath_u6cfg, &z);
	if (!u || !(u->vtep[0] | u->vtep[1] | u->vtep[2] | u->vtep[3]))
		return 0;
	return u;
}

/* The 32-bit stand-in for fp_flow.vtep of a flow first seen over the IPv6 underlay (never read
 * by this half: the side table has the whole address). */
static __always_inline __u32 vtep6_fold(const __u32 *a)
{
	return a[0] ^ a[1] ^ a[2] ^ a[3];
}

/* rx_u6: prg_fastpath_rx for an IPv6 frame on the underlay. */
/* noinline: a subprogram with a stack of its own (inlined, prg_fastpath_rx passes 512 bytes). */
static __attribute__((noinline)) int rx_u6(struct __sk_buff *ctx, const struct fp_cfg *cfg)
{
	struct fp_outer6 o = {};
	struct fp_u6cfg *u = u6_config();
	struct fp_key6 k = {};
	struct fp_pkt6 p;
	__u32 r;

	if (!u) {
		count(FP_DIR_RX, FP_R_OTHER);
		return TCX_NEXT;
	}
	outer6(ctx, cfg, &o);
	if (!a6_eq(o.daddr, u->vtep) || ctx->pkt_type != 0 /* PACKET_HOST */) {
		count(FP_DIR_RX, FP_R_OTHER);
		return TCX_NEXT;
	}
	if (!o.vxlan) {
		count(FP_DIR_RX, o.reason);
		return TCX_NEXT;
	}
	if (!fp_is_ip6(ctx, FP_U6_INNER)) { /* flannel-v6.1 carries IPv6 pods only */
		count(FP_DIR_RX, FP_R_NOTIP);
		return TCX_NEXT;
	}
	r = parse6(ctx, FP_U6_INNER, &p);
	if (r) {
		count(FP_DIR_RX, r);
		return TCX_NEXT;
	}
	key6_in(&k, &p);
	struct fp_nat6 be = {};
	if (nat6_in(&k, &be)) { /* a Service's reply: the normal path's (see above) */
		count(FP_DIR_RX, FP_R_PROTO);
		return TCX_NEXT;
	}
	__u32 vt = vtep6_fold(o.saddr);
	if (p.ctl) {
		if (p.ctl == FP_TCP_SYN) {
			struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
			syn_open(f);
			return handover_in6(ctx, f, &k, &p, cfg, vt, FP_R_PROTO);
		}
		closing6(ctx, &k, p.ctl & FP_TCP_RST ? FP_F_DONE : FP_F_FIN_IN, FP_DIR_RX);
		if (!fin_fast6(&k)) {
			count(FP_DIR_RX, FP_R_PROTO);
			return TCX_NEXT;
		}
	}
	struct fp_flow *f = lookup6(&k, 0, FP_F_IN, cfg->gen, &r);
	if (r != FP_R_HIT)
		return handover_in6(ctx, f, &k, &p, cfg, vt, r);
	if (!f)
		return TCX_NEXT;
	if ((cfg->flags & FP_C_ROUTED) && !mac_eq(p.eth.h_dest, u->vx_mac)) {
		count(FP_DIR_RX, FP_R_L2);
		return TCX_NEXT;
	}
	/* The outer source must be where the normal path sends this flow (lrn_u6). */
	struct fp_vtep6 *rv = bpf_map_lookup_elem(&prg_fastpath_vtep6, &k);
	if (!rv || !a6_eq(rv->addr, o.saddr))
		return handover_in6(ctx, f, &k, &p, cfg, vt, FP_R_STALE);
	struct prg_pod *pod = NULL;
	int pr = pod_lookup6(cfg->netns, p.daddr, &pod);
	if (pr == PRG_POD_MISS || !pod) {
		count(FP_DIR_RX, FP_R_NOPOD);
		return TCX_NEXT;
	}
	if (pr != PRG_POD_OK || pod->ifindex != f->in_ifindex || !mac_eq(pod->ctr_mac, f->in_mac))
		return handover_in6(ctx, f, &k, &p, cfg, vt, FP_R_STALE);
	if (p.ttl <= f->in_ttl_dec) {
		count(FP_DIR_RX, FP_R_TTL);
		return TCX_NEXT;
	}
	__u8 dec = f->in_ttl_dec;
	/* Outer IPv6 + UDP + VXLAN + inner Ethernet: IPv6 on both sides, the protocol stays. */
	if (bpf_skb_adjust_room(ctx, -FP_U6_ENCAP,
				BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_NO_CSUM_RESET)) {
		count(FP_DIR_RX, FP_R_ERR);
		return TCX_NEXT;
	}
	/* The outer UDP checksum was one CHECKSUM_UNNECESSARY level: consumed here, as by UDP. */
	if (bpf_csum_level(ctx, BPF_CSUM_LEVEL_QUERY) >= 0)
		bpf_csum_level(ctx, BPF_CSUM_LEVEL_DEC);
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end) {
		if (bpf_skb_pull_data(ctx, sizeof(struct ethhdr) + FP_IP6_HLEN))
			goto drop;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end)
			goto drop;
	}
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

/* lrn_u6: prg_fastpath_lrn_tx for an IPv6 frame on the underlay's egress: a VXLAN frame from our
 * VTEP records where the kernel sends an existing flow (the side table rx_u6 checks). */
static __attribute__((noinline)) int lrn_u6(struct __sk_buff *ctx, const struct fp_cfg *cfg)
{
	struct fp_outer6 o = {};
	struct fp_u6cfg *u = u6_config();
	struct fp_key6 k = {};
	struct fp_pkt6 p;

	if (!u)
		return tcx_next_opaque();
	outer6(ctx, cfg, &o);
	if (!o.vxlan || !a6_eq(o.saddr, u->vtep) || !fp_is_ip6(ctx, FP_U6_INNER))
		return tcx_next_opaque();
	if (parse6(ctx, FP_U6_INNER, &p))
		return tcx_next_opaque();
	key6_out(&k, &p);
	if (!bpf_map_lookup_elem(&prg_fastpath_flow6, &k))
		return tcx_next_opaque();
	struct fp_vtep6 *rv = bpf_map_lookup_elem(&prg_fastpath_vtep6, &k);
	if (rv && a6_eq(rv->addr, o.daddr))
		return tcx_next_opaque();
	struct fp_vtep6 nv = {};
	__builtin_memcpy(nv.addr, o.daddr, 16);
	bpf_map_update_elem(&prg_fastpath_vtep6, &k, &nv, BPF_ANY);
	return tcx_next_opaque();
}

#endif
