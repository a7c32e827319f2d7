/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath_u6.h: the receiving half of the fast path over an IPv6 underlay (real flannel's
 * dual-stack layout: flannel-v6.1, VXLAN over the nodes' IPv6 addresses, beside flannel.1).
 * Included by fastpath.bpf.c after fastpath6.h.
 *
 * Receive: a kernel sender (flannel-v6.1) puts a valid outer UDP checksum on every frame, so tc
 * ingress on the underlay can strip outer IPv6 + UDP + VXLAN (and the inner Ethernet header) of
 * a learned flow and redirect the inner IPv6 packet to the pod, as rx6 does over the IPv4
 * underlay. A flow is served on receive once learned both ways (inbound alone with FP_C_ONEWAY),
 * as over the IPv4 underlay.
 *
 * Send (tx_u6): for a GSO packet tc cannot build the outer headers itself, as tx6 does over
 * IPv4: it cannot ask for per-segment outer UDP checksums (bpf_skb_adjust_room sets
 * SKB_GSO_UDP_TUNNEL, never _CSUM, and __skb_udp_tunnel_segment then copies the one outer
 * checksum into every segment), and a zero checksum over IPv6 is dropped by a receiving device
 * without udp6zerocsumrx (flannel sets neither udp6zerocsumtx nor udp6zerocsumrx). A packet that
 * is not GSO is encapsulated here (tx_u6_encap: the flow's whole learned header,
 * prg_fastpath_u6tmpl, and an outer checksum computed from the headers alone, below). For a GSO
 * packet, for a flow learned both ways whose egress the normal path
 * sent through flannel-v6.1 (FP_F_U6), tx_u6 rewrites the inner Ethernet header to the one the
 * kernel's neighbour entry gave it (dst: the remote VTEP's flannel-v6.1 MAC, src: ours, learned
 * by lrn_u6 from the kernel's own frame into the flow's template), lowers the hop limit as the
 * routed hop did, and redirects the inner frame to flannel-v6.1's egress: the vxlan driver
 * encapsulates it (its FDB lookup, GSO, the outer checksum), while the bridge, the inner
 * routing, the inner packet's netfilter hooks and the neighbour output are skipped.
 * flannel-v6.1's ifindex comes from the agent (prg_fastpath_u6dev; 0: sending off).
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
/* skb->tc_index of a frame tx_u6 redirected to flannel-v6.1, so the underlay's egress learner
 * skips the VXLAN frame the driver makes of it (tc_index survives the encapsulation). */
#define FP_TC_INDEX_U6 0xfa5d

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

/* The sending half's device: flannel-v6.1's ifindex (0: off). A map of its own, so
 * prg_fastpath_u6cfg's layout stays as pinned. */
struct fp_u6dev {
	__u32 ifindex;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_u6dev);
} prg_fastpath_u6dev SEC(".maps");

struct fp_vtep6 {
	__u32 addr[4];
};

/* The whole header the kernel put before a flow's inner IPv6 packet over the IPv6 underlay:
 * outer Ethernet 14 + IPv6 40 + UDP 8 + VXLAN 8 + inner Ethernet 14 (fp_flow.tmpl has 64 bytes:
 * a side table keyed by the flow, as prg_fastpath_vtep6), the underlay device it left on, and the
 * flow's out_ns when learned (a template of an earlier learning is never used). tx_u6_encap
 * pushes it in the program for a packet that is not GSO (see the top). */
#define FP_U6_TMPL_LEN 84
struct fp_u6tmpl {
	__u8 hdr[FP_U6_TMPL_LEN];
	__u32 ifindex;
	__u64 out_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FP_MAX_FLOWS6);
	__type(key, struct fp_key6);
	__type(value, struct fp_u6tmpl);
} prg_fastpath_u6tmpl SEC(".maps");

/* Of the egress hits (FP_R_HIT), the packets tx_u6_encap encapsulated itself (the rest went to
 * flannel-v6.1's driver). A map of its own: prg_fastpath_stat2's size stays as pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} prg_fastpath_u6enc SEC(".maps");

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
	/* Learned both ways, as rx6 (one way: FP_C_ONEWAY, opt-in): lrn_u6 learns the egress. */
	__u32 need = cfg->flags & FP_C_ONEWAY ? FP_F_IN : FP_F_OUT | FP_F_IN;
	struct fp_flow *f = lookup6(&k, 0, need, cfg->gen, &r);
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
	if (p.ttl <= f->in_ttl_dec) /* the normal path sends the ICMP error, or re-learns the change */
		return handover_in6(ctx, f, &k, &p, cfg, vt, FP_R_TTL);
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
 * VTEP records where the kernel sends an existing flow (the side table rx_u6 checks) and, for a
 * flow tx6 handed over (its hop limit recorded, as lrn_tx_u4 learns), the egress direction: the
 * inner Ethernet header flannel-v6.1 was given (the template's first 14 bytes, FP_F_U6). */
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
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
	if (!f)
		return tcx_next_opaque();
	struct fp_vtep6 *rv = bpf_map_lookup_elem(&prg_fastpath_vtep6, &k);
	if (!rv || !a6_eq(rv->addr, o.daddr)) {
		struct fp_vtep6 nv = {};
		__builtin_memcpy(nv.addr, o.daddr, 16);
		bpf_map_update_elem(&prg_fastpath_vtep6, &k, &nv, BPF_ANY);
	}
	/* Not a flow the fast path handed over, or one the normal path translated (a Service's:
	 * the IPv6 underlay's sending does not replay NAT), or a FIN/RST: learn nothing. */
	if (!f->out_ttl_seen || f->out_ttl_seen < p.ttl || (p.ctl & (FP_TCP_FIN | FP_TCP_RST)) ||
	    (f->flags & (FP_F_ALIAS | FP_F_DNAT | FP_F_NATX)))
		return tcx_next_opaque();
	local_forget(f); /* it left this node (fastpath_local6.h): a remote flow again */
	if (bpf_skb_load_bytes(ctx, FP_U6_INNER, f->tmpl, sizeof(struct ethhdr)))
		return tcx_next_opaque();
	__sync_fetch_and_or(&f->flags, FP_F_U6);
	learned_out(f, vtep6_fold(o.daddr), p.ttl, p.proto, p.ctl);
	/* The whole header for tx_u6_encap, bound to this learning (out_ns). */
	struct fp_u6tmpl *t = bpf_map_lookup_elem(&prg_fastpath_u6tmpl, &k);
	if (!t) {
		struct fp_u6tmpl z = {};
		bpf_map_update_elem(&prg_fastpath_u6tmpl, &k, &z, BPF_ANY);
		t = bpf_map_lookup_elem(&prg_fastpath_u6tmpl, &k);
	}
	if (t) {
		t->out_ns = 0; /* not usable while being written */
		asm volatile("" ::: "memory");
		if (!bpf_skb_load_bytes(ctx, 0, t->hdr, FP_U6_TMPL_LEN)) {
			t->ifindex = ctx->ifindex;
			asm volatile("" ::: "memory");
			t->out_ns = f->out_ns;
		}
	}
	learned_report(&k, sizeof(k), f, p.proto, 1, 0);
	return tcx_next_opaque();
}

/* csum16 adds the 16-bit words of n (even) bytes at b to sum as they lie in memory (ones'
 * complement sums are byte-order independent, RFC 1071: the result is in network order). */
static __always_inline __u32 csum16(const void *b, int n, __u32 sum)
{
	const __u16 *w = b;
#pragma unroll
	for (int i = 0; i < n / 2; i++)
		sum += w[i];
	return sum;
}

/* tx_u6_encap: tx_u6's hit for a packet that is not GSO: the outer headers are pushed here, as
 * tx6 does over IPv4, with a valid outer UDP checksum computed without reading the payload.
 * Returns the verdict (TC_ACT_REDIRECT, TC_ACT_SHOT), or -1 (not TCX_NEXT's meaning): the
 * caller goes on through flannel-v6.1 (nothing was changed).
 *
 * The checksum: the inner TCP/UDP/ICMPv6 checksum, whether already in the packet or still to be
 * filled in (CHECKSUM_PARTIAL: the NIC or skb_checksum_help does it later), makes the 16-bit sum
 * of the inner L4 bytes equal the complement of the inner pseudo-header's sum (P). So the outer
 * UDP checksum covers: the outer pseudo header, the UDP and VXLAN headers, the inner Ethernet and
 * IPv6 headers, and ~P, in which the inner addresses and payload length cancel those of the
 * inner IPv6 header: 38 header bytes and the 32 bytes of outer addresses, as lco_csum does for
 * the driver. A template rewritten while being copied is the same flow's header from the kernel
 * (as fp_flow.tmpl over IPv4, written in place). */
static __always_inline int tx_u6_encap(struct __sk_buff *ctx, struct fp_flow *f, const struct fp_key6 *k,
					const struct fp_cfg *cfg)
{
	struct fp_u6tmpl *t = bpf_map_lookup_elem(&prg_fastpath_u6tmpl, k);
	__u64 ns = f->out_ns;
	if (!t || t->out_ns != ns || !ns || t->ifindex != cfg->underlay)
		return -1;
	/* The underlay's MTU, as tx6 checks it over IPv4 (the driver path checks flannel-v6.1's). */
	if (ctx->len - sizeof(struct ethhdr) + FP_U6_ENCAP > cfg->mtu)
		return -1;
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end)
		return -1; /* tx_u6 pulled it */
	struct ipv6hdr *iip = data + sizeof(struct ethhdr);
	__u8 nh = iip->nexthdr;
	if (nh != PRG_IPPROTO_TCP && nh != PRG_IPPROTO_UDP && nh != 58 /* ICMPv6 */)
		return -1;
	/* Few values live across the helpers below (tx6's frame leaves this subprogram little
	 * stack): the rest is read again from the packet. */
	if (bpf_skb_adjust_room(ctx, FP_U6_ENCAP, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 |
					BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
					FP_ADJ_ROOM_ENCAP_L2(sizeof(struct ethhdr))))
		return -1; /* nothing changed (skb_cow_head keeps the bytes): the driver's way */
#define FP_U6_HDRS (FP_U6_TMPL_LEN + FP_IP6_HLEN)
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + FP_U6_HDRS > end) {
		if (bpf_skb_pull_data(ctx, FP_U6_HDRS))
			goto drop;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + FP_U6_HDRS > end)
			goto drop;
	}
	/* 21 words (unaligned stores to the packet are fine where BPF runs JITed) */
	__u32 *dw = data;
	const __u32 *tw = (const __u32 *)t->hdr;
#pragma unroll
	for (int i = 0; i < FP_U6_TMPL_LEN / 4; i++)
		dw[i] = tw[i];
	__u8 *b = data;
	struct ipv6hdr *oip = data + sizeof(struct ethhdr);
	struct udphdr *oudp = data + sizeof(struct ethhdr) + FP_IP6_HLEN;
	iip = data + FP_U6_TMPL_LEN;
	__u32 plen = ctx->len - sizeof(struct ethhdr) - FP_IP6_HLEN; /* the outer payload */
	/* ip6_flow_hdr with ip_tunnel_ecn_encap's ECN (CE becomes ECT(0)); DSCP, flow label and the
	 * UDP source port as the kernel gave them to this flow (the template is the flow's own:
	 * flannel-v6.1's port range need not be flannel.1's, which cfg has). */
	__u8 ecn = (iip->flow_lbl[0] >> 4) & 3;
	oip->flow_lbl[0] = (oip->flow_lbl[0] & ~0x30) | ((ecn == 3 ? 2 : ecn) << 4);
	oip->payload_len = bpf_htons(plen);
	oudp->len = bpf_htons(plen);
	oudp->check = 0;
	iip->hop_limit -= f->out_ttl_dec;
	/* In network order throughout. Outer pseudo header: addresses, length, next header 17. */
	__u32 sum = csum16(b + sizeof(struct ethhdr) + 8, 32, (__u32)bpf_htons(plen) + bpf_htons(PRG_IPPROTO_UDP));
	/* UDP, VXLAN, inner Ethernet and the inner IPv6 header's first 8 bytes; its addresses cancel
	 * against ~P's, and so do its payload length and next header (P has it as 0x00nh, the
	 * header word as nh:hop limit), subtracted here. */
	sum = csum16(b + sizeof(struct ethhdr) + FP_IP6_HLEN, FP_U6_ENCAP - FP_IP6_HLEN + 8, sum);
	sum += (__u16)~iip->payload_len;
	sum += (__u16)~bpf_htons(iip->nexthdr);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	__u16 c = ~sum & 0xffff;
	oudp->check = c ? c : 0xffff;
	ctx->mark = FP_MARK; /* the underlay's egress learner gives it back */
	__u32 z = 0;
	__u64 *n = bpf_map_lookup_elem(&prg_fastpath_u6enc, &z);
	if (n)
		*n += 1;
	count(FP_DIR_TX, FP_R_HIT);
	return bpf_redirect(t->ifindex, 0); /* cfg->underlay: checked above */
drop:
	count(FP_DIR_TX, FP_R_DROP);
	return TC_ACT_SHOT;
}

/* tx_u6: tx6's hit for a flow learned over the IPv6 underlay (FP_F_U6), after tx6's checks (both
 * ways learned and fresh, the pod's own veth, no mark, hop limit): the inner frame goes to
 * flannel-v6.1 with the Ethernet header the normal path gave it (see the top). */
static __attribute__((noinline)) int tx_u6(struct __sk_buff *ctx, struct fp_flow *f, const struct fp_key6 *k,
					    const struct fp_cfg *cfg)
{
	__u32 z = 0, mtu = 0;
	struct fp_u6dev *d = bpf_map_lookup_elem(&prg_fastpath_u6dev, &z);

	if (!d || !d->ifindex || (f->flags & FP_F_DNAT)) {
		count(FP_DIR_TX, FP_R_UNSUP);
		return TCX_NEXT;
	}
	/* flannel-v6.1's own MTU, per segment for GSO, as ip6_forward checks it (the normal path
	 * then sends the pod its Packet Too Big); an ifindex gone fails here too. */
	if (bpf_check_mtu(ctx, d->ifindex, &mtu, 0, BPF_MTU_CHK_SEGS)) {
		count(FP_DIR_TX, FP_R_MTU);
		return TCX_NEXT;
	}
	__u8 dec = f->out_ttl_dec;
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end) {
		if (bpf_skb_pull_data(ctx, sizeof(struct ethhdr) + FP_IP6_HLEN)) {
			count(FP_DIR_TX, FP_R_ERR);
			return TCX_NEXT;
		}
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end) {
			count(FP_DIR_TX, FP_R_ERR);
			return TCX_NEXT;
		}
	}
	if (!ctx->gso_size) { /* one packet: encapsulated here when its template is learned */
		int v = tx_u6_encap(ctx, f, k, cfg);
		if (v != -1)
			return v;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end) {
			count(FP_DIR_TX, FP_R_ERR);
			return TCX_NEXT;
		}
	}
	__builtin_memcpy(data, f->tmpl, 12); /* dst, src MAC; the EtherType stays IPv6 */
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	ip6->hop_limit -= dec;
	/* The underlay's egress learner skips the frame the driver builds of it (no skb mark: the
	 * outer packet's route lookup and netfilter see it, and kube-proxy's masquerade bit is in
	 * FP_MARK). */
	ctx->tc_index = FP_TC_INDEX_U6;
	count(FP_DIR_TX, FP_R_HIT);
	return bpf_redirect(d->ifindex, 0);
}

#endif
