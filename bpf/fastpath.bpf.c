// SPDX-License-Identifier: GPL-2.0
/*
 * fastpath: an ONCache-style overlay fast path on a stock kernel. Per-flow caches, learned from
 * what the kernel's normal overlay path actually did with a flow's packets, replay that work in
 * tc for the flow's later packets.
 *
 * Flannel layout (VXLAN device, bridge, pod veths and the underlay all in the host namespace):
 *   prg_fastpath_tx      tcx ingress of each host-side pod veth (packets leaving a pod): push the
 *                        outer Ethernet/IPv4/UDP/VXLAN headers and the inner Ethernet header the
 *                        kernel built for this flow, redirect to the underlay. Skips the bridge,
 *                        IP forwarding, the VXLAN device and the host's IP/UDP output.
 *   prg_fastpath_rx      tcx ingress of the underlay: a VXLAN frame to this VTEP with our VNI and
 *                        a learned flow to a local pod loses its outer headers and is handed to
 *                        the pod with bpf_redirect_peer. Skips vxlan_rcv, gro_cells, the bridge
 *                        or IP forwarding, and the veth backlog.
 *   prg_fastpath_lrn_tx  tcx egress of the underlay: learns the template (the first 64 bytes of
 *                        the frame the VXLAN device built) of flows leaving local pods.
 *   prg_fastpath_lrn_rx  tcx egress of each host-side pod veth: learns how the normal path
 *                        delivered a flow to the pod (MACs, TTL change, which veth).
 * Docker layout (VXLAN device and bridge in an overlay namespace, the underlay in the host's):
 *   a redirect cannot leave the overlay namespace, so only the bridge and the veth backlog go:
 *   prg_fastpath_dtx     tcx ingress of each bridge-side veth: redirect to the VXLAN device
 *                        (skips the bridge; the kernel still encapsulates).
 *   prg_fastpath_drx     tcx ingress of the VXLAN device: redirect_peer into the container
 *                        (skips the bridge and the veth backlog).
 *   prg_fastpath_dlrn_tx tcx egress of the VXLAN device: learns that the bridge sends the flow
 *                        there, and with which Ethernet header.
 *   prg_fastpath_lrn_rx  as above, on the bridge-side veths.
 *
 * "Established": a flow is fast only after the normal path carried it in both directions. The
 * learners sit at the far end of the normal path, so what they see was accepted by the kernel's
 * routing, bridge and firewall; a direction is marked learned only for packets the fast path
 * handed to the normal path itself (it records the TTL it saw, from which the learner derives
 * the normal path's TTL change). Each direction is re-learned from the normal path every
 * FP_REVALIDATE_NS (one packet takes the normal path), so conntrack and routing stay in the loop
 * and a cache is never older than that. TCP SYN/FIN/RST always take the normal path (conntrack
 * sees the connection open and close). The node agent deletes flows within a second of a
 * neighbour, FDB, route, MTU, VXLAN device or pod change. Delivery goes through the endpoint
 * table of pod.h, which cannot misdeliver to a vanished or replaced pod.
 *
 * Services (flannel layout): a flow the normal path DNATs (kube-proxy's rules) is learned with
 * its backend and translated on both ways per connection; see fastpath_nat.h.
 *
 * Every miss returns TCX_NEXT, so later tcx programs and the CNI's own path run unchanged.
 */
#include "fastpath.h"
#include "fastpath6.h"
#include "fastpath_u6.h"

char LICENSE[] SEC("license") = "GPL";

/* ---- flannel layout ---- */

static __always_inline int tx_main(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg = fp_config();
	struct fp_key k = {};
	struct fp_pkt p;

	if (!cfg || (cfg->flags & FP_C_DOCKER))
		return TCX_NEXT;
	if (fp_is_ip6(ctx, 0)) /* a dual-stack pod's IPv6: fastpath6.h */
		return tx6(ctx);
	struct fp_flow *f = begin_out(ctx, cfg, &p, &k);
	if (!f)
		return TCX_NEXT;
	if (f->out_ifindex != ctx->ifindex)
		return handover_out(f, &k, &p, ctx, FP_R_STALE);
	if ((cfg->flags & FP_C_UNSUP) || ctx->mark) {
		count(FP_DIR_TX, FP_R_UNSUP);
		return TCX_NEXT;
	}
	if (p.ttl <= f->out_ttl_dec) /* the normal path sends the ICMP error, or re-learns the change */
		return handover_out(f, &k, &p, ctx, FP_R_TTL);
	if (f->flags & FP_F_LOCAL) /* to a pod on this node: fastpath_local.h */
		return local_tx(ctx, cfg, f, &k, &p);
	/* Outer IPv4 length of the (largest) frame on the wire. */
	__u32 wire = ctx->gso_size ? ctx->gso_size + p.hdrs + FP_ENCAP_LEN : ctx->len - sizeof(struct ethhdr) + FP_ENCAP_LEN;
	if (wire > cfg->mtu) {
		count(FP_DIR_TX, FP_R_MTU);
		return TCX_NEXT;
	}
	if (f->flags & FP_F_DNAT) {
		/* The Service's translation, as conntrack applied it to this connection. */
		int nr = nat_rewrite(ctx, sizeof(struct ethhdr), 16, 2, p.proto, p.daddr, f->nat_addr, p.dport, f->nat_port);
		if (nr > 0) {
			count(FP_DIR_TX, FP_R_ERR);
			return TCX_NEXT;
		}
		if (nr < 0)
			goto drop;
	}

	/* The outer UDP checksum is always 0, also where the device computes one (udpcsum, the
	 * kernel's default): BPF cannot mark a GSO packet for per-segment outer checksums
	 * (SKB_GSO_UDP_TUNNEL_CSUM), and RFC 7348 lets VXLAN over IPv4 send 0, which every receiver
	 * accepts. Everything else is what the device builds.
	 * Source port: udp_flow_src_port() of the flow's hash. A hash the packet already carries
	 * (a pod's TCP socket sets one) is what the device will use; without one the device would
	 * run the flow dissector over the inner headers, which gives every packet of the flow the
	 * value it gave the learned packet, so the template's port stands (saves the dissection). */
	__u32 hash = ctx->hash;
	__u32 olen = ctx->len + FP_ENCAP_LEN - sizeof(struct ethhdr);
	__u16 id = bpf_get_prandom_u32();

	if (bpf_skb_adjust_room(ctx, FP_ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
					BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
					FP_ADJ_ROOM_ENCAP_L2(sizeof(struct ethhdr)))) {
		count(FP_DIR_TX, FP_R_ERR);
		return TCX_NEXT;
	}
	/* The headers are written in place (no helper per field): template, then the fixes. */
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + FP_TMPL_LEN + sizeof(struct iphdr) > end) {
		if (bpf_skb_pull_data(ctx, FP_TMPL_LEN + sizeof(struct iphdr)))
			goto drop;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + FP_TMPL_LEN + sizeof(struct iphdr) > end)
			goto drop;
	}
	__builtin_memcpy(data, f->tmpl, FP_TMPL_LEN);
	struct iphdr *oip = data + sizeof(struct ethhdr);
	struct udphdr *oudp = (void *)(oip + 1);
	/* Above 64 KiB (BIG TCP) the outer lengths are 0, as iph_set_totlen writes them: the
	 * segmentation (software, or a NIC's) writes each segment's own. */
	oip->tot_len = olen > FP_IP_MAX ? 0 : bpf_htons(olen);
	oip->id = id;
	/* ip_tunnel_ecn_encap: the outer ECN field follows the inner one (CE becomes ECT(0)). */
	oip->tos = (oip->tos & ~3) | ((p.tos & 3) == 3 ? 2 : (p.tos & 3));
	oip->check = 0;
	oip->check = ip_csum(oip);
	if (hash) {
		hash ^= hash << 16;
		oudp->source = bpf_htons((__u16)((((__u64)hash) * (__u32)(cfg->port_max - cfg->port_min)) >> 32) +
					 cfg->port_min);
	}
	oudp->len = olen > FP_IP_MAX ? 0 : bpf_htons(olen - sizeof(struct iphdr));
	oudp->check = 0;
	ttl_sub_ip(data + FP_TMPL_LEN, f->out_ttl_dec);
	ctx->mark = FP_MARK;
	count(FP_DIR_TX, FP_R_HIT);
	return bpf_redirect(cfg->underlay, 0);
drop:
	count(FP_DIR_TX, FP_R_DROP);
	return TC_ACT_SHOT;
}

SEC("tcx/ingress")
int prg_fastpath_tx(struct __sk_buff *ctx)
{
	return tx_main(ctx);
}

/* What the fast path needs of a frame's outer headers. */
struct fp_outer {
	__u32 saddr, daddr;
	__u8 vxlan;  /* a VXLAN frame of our overlay: our port and VNI, flags exactly I */
	__u8 reason; /* otherwise FP_R_OPTS/FP_R_FRAG for IPv4 UDP with options or fragmented, else FP_R_OTHER */
};

static __always_inline int outer_at(const struct prg_pkt *pk, const struct fp_cfg *cfg, struct fp_outer *o)
{
	struct prg_hdrs h = {};
	struct prg_vxlan vx;
	int r = prg_parse_frame(pk, 0, 0, &h);
	o->reason = FP_R_OTHER;
	if (r == PRG_SHORT)
		return r;
	if (r != PRG_OK || h.family != 4)
		return PRG_OK;
	o->saddr = h.flow.saddr[0];
	o->daddr = h.flow.daddr[0];
	if (h.flow.proto == PRG_IPPROTO_UDP) {
		if (h.l4_off - h.l3_off != sizeof(struct iphdr)) {
			o->reason = FP_R_OPTS;
			return PRG_OK;
		}
		if (h.frag) {
			o->reason = FP_R_FRAG;
			return PRG_OK;
		}
	}
	r = prg_vxlan_of(pk, &h, cfg->vxlan_ports, &vx);
	if (r != PRG_OK)
		return r == PRG_SHORT ? r : PRG_OK;
	__u32 *hdr = prg_at(pk, h.l4_off + sizeof(struct udphdr), PRG_VXLAN_HLEN);
	if (!hdr)
		return PRG_SHORT;
	/* Exactly the I flag (no GBP/GPE bits) and our VNI: what the device itself accepts. */
	if (hdr[0] != bpf_htonl(0x08000000) || vx.vni != cfg->vni || hdr[1] & bpf_htonl(0xff))
		return PRG_OK;
	o->vxlan = 1;
	return PRG_OK;
}

static __always_inline void outer(struct __sk_buff *ctx, const struct fp_cfg *cfg, struct fp_outer *o)
{
	struct prg_pkt pk;
	int r;

	prg_pkt_tc(&pk, ctx);
	PRG_TC_PARSE(r, &pk, ctx, outer_at(&pk, cfg, o));
	if (r != PRG_OK)
		o->vxlan = 0;
}

static __attribute__((noinline)) int rx_u4(struct __sk_buff *ctx, struct fp_cfg *cfg);

static __always_inline int rx_main(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg = fp_config();

	if (!cfg || (cfg->flags & FP_C_DOCKER))
		return TCX_NEXT;
	/* A frame GRO built above 64 KiB (the underlay's gro_ipv4_max_size raised): the normal
	 * path's, as on egress. */
	if (ctx->len > FP_IP_MAX + sizeof(struct ethhdr)) {
		count(FP_DIR_RX, FP_R_BIG);
		return TCX_NEXT;
	}
	if (ctx->protocol == bpf_htons(PRG_ETH_P_IPV6)) /* the IPv6 underlay: fastpath_u6.h */
		return rx_u6(ctx, cfg);
	return rx_u4(ctx, cfg);
}

SEC("tcx/ingress")
int prg_fastpath_rx(struct __sk_buff *ctx)
{
	return rx_main(ctx);
}

/* rx_u4: prg_fastpath_rx over the IPv4 underlay. Each underlay's receive is a subprogram with a
 * stack of its own: together in one function they pass the verifier's 512 bytes. */
static __attribute__((noinline)) int rx_u4(struct __sk_buff *ctx, struct fp_cfg *cfg)
{
	struct fp_outer o = {};
	struct fp_key k = {};
	struct fp_pkt p;

	outer(ctx, cfg, &o);
	if (o.daddr != cfg->vtep || ctx->pkt_type != 0 /* PACKET_HOST */) {
		count(FP_DIR_RX, FP_R_OTHER);
		return TCX_NEXT;
	}
	if (!o.vxlan) {
		count(FP_DIR_RX, o.reason);
		return TCX_NEXT;
	}
	if (fp_is_ip6(ctx, FP_TMPL_LEN - sizeof(struct ethhdr))) /* IPv6 inside: fastpath6.h */
		return rx6(ctx, o.saddr);
	struct fp_flow *f = begin_in(ctx, FP_TMPL_LEN - sizeof(struct ethhdr), &p, &k, o.saddr, cfg);
	if (!f)
		return TCX_NEXT;
	/* flannel.1 takes only frames to its own MAC (anything else is PACKET_OTHERHOST there). */
	if ((cfg->flags & FP_C_ROUTED) && !mac_eq(p.eth.h_dest, cfg->vx_mac)) {
		count(FP_DIR_RX, FP_R_L2);
		return TCX_NEXT;
	}
	if (f->vtep != o.saddr) /* the remote end moved to another node */
		return handover_in(ctx, f, &k, &p, o.saddr, FP_R_STALE);
	struct prg_pod *pod = NULL;
	int pr = prg_pod_lookup4(&prg_fastpath_ep, &prg_fastpath_port, cfg->netns, p.daddr, &pod);
	if (pr == PRG_POD_MISS || !pod) {
		count(FP_DIR_RX, FP_R_NOPOD);
		return TCX_NEXT;
	}
	if (pr != PRG_POD_OK || pod->ifindex != f->in_ifindex || !mac_eq(pod->ctr_mac, f->in_mac))
		return handover_in(ctx, f, &k, &p, o.saddr, FP_R_STALE);
	if (p.ttl <= f->in_ttl_dec) /* the normal path sends the ICMP error, or re-learns the change */
		return handover_in(ctx, f, &k, &p, o.saddr, FP_R_TTL);
	if (bpf_skb_adjust_room(ctx, -FP_ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_NO_CSUM_RESET)) {
		count(FP_DIR_RX, FP_R_ERR);
		return TCX_NEXT;
	}
	/* The outer UDP header was one CHECKSUM_UNNECESSARY level, zero checksum or not (skbuff.h:
	 * "UDP (possibly zero)"); the kernel's UDP receive consumes it, and so does the fast path. */
	if (bpf_csum_level(ctx, BPF_CSUM_LEVEL_QUERY) >= 0)
		bpf_csum_level(ctx, BPF_CSUM_LEVEL_DEC);
	if (f->in_ttl_dec) {
		void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + sizeof(struct iphdr) > end) {
			if (bpf_skb_pull_data(ctx, sizeof(struct ethhdr) + sizeof(struct iphdr)))
				goto drop;
			data = (void *)(long)ctx->data;
			end = (void *)(long)ctx->data_end;
			if (data + sizeof(struct ethhdr) + sizeof(struct iphdr) > end)
				goto drop;
		}
		ttl_sub_ip(data + sizeof(struct ethhdr), f->in_ttl_dec);
	}
	/* A Service's reply: its source back to the Service address the pod sent to (k.remote,
	 * k.rport: begin_in resolved the alias), as conntrack reverses the DNAT. */
	if ((f->flags & FP_F_DNAT) &&
	    nat_rewrite(ctx, sizeof(struct ethhdr), 12, 0, p.proto, p.saddr, k.remote, p.sport, k.rport))
		goto drop;
	long v = prg_pod_deliver(ctx, f->in_mac, f->in_mac + 6, pod->ifindex);
	if (v < 0)
		goto drop;
	count(FP_DIR_RX, FP_R_HIT);
	return v;
drop:
	count(FP_DIR_RX, FP_R_DROP);
	return TC_ACT_SHOT;
}

static __attribute__((noinline)) int lrn_tx_u4(struct __sk_buff *ctx, struct fp_cfg *cfg, int handed);

static __always_inline int lrn_tx_main(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg;

	if (ctx->mark == FP_MARK) { /* ours: give the mark back */
		ctx->mark = 0;
		return TCX_NEXT;
	}
	__u32 ti = ctx->tc_index; /* read once (as in prg_fastpath_dlrn_tx) */
	if (ti == FP_TC_INDEX_U6) { /* tx_u6's, encapsulated by flannel-v6.1 */
		ctx->tc_index = 0;
		return TCX_NEXT;
	}
	int handed = ti == FP_TC_INDEX_OUT;
	if (handed || ti == FP_TC_INDEX_NOOUT) /* handover_out's: give it back */
		ctx->tc_index = 0;
	if (ti == FP_TC_INDEX_NOOUT) /* a flow without an entry: nothing to learn */
		return TCX_NEXT;
	cfg = fp_config();
	if (!cfg)
		return TCX_NEXT;
	if (ctx->protocol == bpf_htons(PRG_ETH_P_IPV6)) /* the IPv6 underlay: fastpath_u6.h */
		return lrn_u6(ctx, cfg);
	return lrn_tx_u4(ctx, cfg, handed);
}

SEC("tcx/egress")
int prg_fastpath_lrn_tx(struct __sk_buff *ctx)
{
	return lrn_tx_main(ctx);
}

/* lrn_tx_u4: prg_fastpath_lrn_tx over the IPv4 underlay (a subprogram: as rx_u4). */
static __attribute__((noinline)) int lrn_tx_u4(struct __sk_buff *ctx, struct fp_cfg *cfg, int handed)
{
	struct fp_outer o = {};
	struct fp_key k = {};
	struct fp_pkt p;

	outer(ctx, cfg, &o);
	if (!o.vxlan || o.saddr != cfg->vtep)
		return tcx_next_opaque();
	if (fp_is_ip6(ctx, FP_TMPL_LEN - sizeof(struct ethhdr)))
		return lrn_tx6(ctx, o.daddr, handed);
	if (parse(ctx, FP_TMPL_LEN - sizeof(struct ethhdr), &p) || (p.ctl & (FP_TCP_FIN | FP_TCP_RST)))
		return tcx_next_opaque();
	key_out(&k, &p);
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow, &k);
	__u32 nat_addr = 0;
	__u16 nat_port = 0;
	if (handed && (!f || (f->flags & FP_F_ALIAS) || !f->out_ttl_seen)) {
		f = learn_dnat(ctx, FP_TMPL_LEN, &k, &p, o.daddr);
		if (!f)
			return tcx_next_opaque();
		nat_addr = k.remote;
		nat_port = k.rport;
	} else if (!f || !f->out_ttl_seen || f->out_ttl_seen < p.ttl) {
		return tcx_next_opaque(); /* not a flow the fast path handed over */
	}
	local_forget(f);
	if (bpf_skb_load_bytes(ctx, 0, f->tmpl, sizeof(f->tmpl)))
		return tcx_next_opaque();
	/* Translated or not, as the normal path did it this time (rules can change). */
	f->nat_addr = nat_addr;
	f->nat_port = nat_port;
	if (nat_addr)
		__sync_fetch_and_or(&f->flags, FP_F_DNAT);
	else
		__sync_fetch_and_and(&f->flags, ~(FP_F_DNAT | FP_F_NATX));
	learned_out(f, o.daddr, p.ttl, p.proto, p.ctl);
	learned_report4(&k, nat_addr != 0, f, p.proto, 1, 0);
	return tcx_next_opaque();
}

static __attribute__((noinline)) int lrn_rx4(struct __sk_buff *ctx, struct fp_cfg *cfg, int handed, int noout);

/* Both layouts: how the normal path delivers a flow to the pod, at the end of that path. Each
 * family's learner is a subprogram with a stack of its own: inlined together they pass the
 * 512 bytes (IPv6's same-node Service learning, fastpath_local6.h, with its 40-byte keys). */
static __always_inline int lrn_rx_main(struct __sk_buff *ctx)
{
	__u32 ti = ctx->tc_index; /* read once (as in prg_fastpath_dlrn_tx) */
	int handed = ti == FP_TC_INDEX_OUT; /* a local pod's veth handed it over */
	/* The tx or rx program found no entry for the frame's flow (FP_TC_INDEX_NOOUT/NOIN). */
	int noout = ti == FP_TC_INDEX_NOOUT, noin = ti == FP_TC_INDEX_NOIN;
	if (ti == PRG_TC_INDEX_LEARN || handed || noout || noin) /* handovers': give it back */
		ctx->tc_index = 0;
	/* From the underlay, its flow without an entry; or from a local pod, its flow without an
	 * entry, or its source refused (src_refused: a forged frame must not finish another flow's
	 * pending learning): nothing to learn. */
	if (noin || noout)
		return TCX_NEXT;
	struct fp_cfg *cfg = fp_config();
	if (!cfg)
		return TCX_NEXT;
	if (!(cfg->flags & FP_C_DOCKER) && fp_is_ip6(ctx, 0))
		return lrn_rx6(ctx, cfg, handed);
	return lrn_rx4(ctx, cfg, handed, noout);
}

static __attribute__((noinline)) int lrn_rx4(struct __sk_buff *ctx, struct fp_cfg *cfg, int handed, int noout)
{
	struct fp_key k = {};
	struct fp_pkt p;

	if (parse(ctx, 0, &p) || (p.ctl & (FP_TCP_FIN | FP_TCP_RST)))
		return TCX_NEXT;
	if (!(cfg->flags & FP_C_DOCKER) && !noout)
		local_learn(ctx, cfg, &p, handed); /* same node: fastpath_local.h */
	key_in(&k, &p);
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow, &k);
	if (!f || !f->in_ttl_seen || f->in_ttl_seen < p.ttl)
		return TCX_NEXT;
	__u32 was = f->flags;
	learned_in(f, &p.eth, ctx->ifindex, p.ttl, p.proto, p.ctl);
	learned_report4(&k, 0, f, p.proto, 0, was);
	return TCX_NEXT;
}

SEC("tcx/egress")
int prg_fastpath_lrn_rx(struct __sk_buff *ctx)
{
	return lrn_rx_main(ctx);
}

/* ---- docker layout (VXLAN device and bridge in the overlay namespace) ---- */

SEC("tcx/ingress")
int prg_fastpath_dtx(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg = fp_config();
	struct fp_key k = {};
	struct fp_pkt p;

	if (!cfg || !(cfg->flags & FP_C_DOCKER))
		return TCX_NEXT;
	struct fp_flow *f = begin_out(ctx, cfg, &p, &k);
	if (!f)
		return TCX_NEXT;
	/* The bridge sent this flow to the VXLAN device with this very Ethernet header. */
	if (f->out_ifindex != ctx->ifindex || !mac_eq(p.eth.h_dest, f->tmpl) || !mac_eq(p.eth.h_source, f->tmpl + 6))
		return handover_out(f, &k, &p, ctx, FP_R_STALE);
	if (f->out_ttl_dec || (cfg->flags & FP_C_UNSUP) || ctx->mark) {
		count(FP_DIR_TX, FP_R_UNSUP);
		return TCX_NEXT;
	}
	ctx->mark = FP_MARK;
	count(FP_DIR_TX, FP_R_HIT);
	return bpf_redirect(cfg->vx_ifindex, 0);
}

SEC("tcx/egress")
int prg_fastpath_dlrn_tx(struct __sk_buff *ctx)
{
	struct fp_key k = {};
	struct fp_pkt p;

	if (ctx->mark == FP_MARK) {
		ctx->mark = 0;
		return TCX_NEXT;
	}
	__u32 ti = ctx->tc_index; /* read once: clang would keep &ctx->tc_index, which the verifier refuses */
	if (ti == FP_TC_INDEX_OUT || ti == FP_TC_INDEX_NOOUT) /* handover_out's (the docker layout learns by key) */
		ctx->tc_index = 0;
	if (ti == FP_TC_INDEX_NOOUT) /* a flow without an entry: nothing to learn */
		return TCX_NEXT;
	if (!fp_config() || parse(ctx, 0, &p) || (p.ctl & (FP_TCP_FIN | FP_TCP_RST)))
		return TCX_NEXT;
	key_out(&k, &p);
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow, &k);
	if (!f || !f->out_ttl_seen || f->out_ttl_seen < p.ttl)
		return TCX_NEXT;
	__builtin_memcpy(f->tmpl, &p.eth, sizeof(p.eth));
	ttl_learned(&f->out_ttl_seen, &f->out_ttl_dec, p.ttl);
	f->out_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory");
	f->flags |= FP_F_OUT;
	hs_learned(f, &p);
	count(FP_DIR_TX, FP_R_LEARN);
	learned_report4(&k, 0, f, p.proto, 1, 0);
	return TCX_NEXT;
}

SEC("tcx/ingress")
int prg_fastpath_drx(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg = fp_config();
	struct fp_key k = {};
	struct fp_pkt p;

	if (!cfg || !(cfg->flags & FP_C_DOCKER))
		return TCX_NEXT;
	struct fp_flow *f = begin_in(ctx, 0, &p, &k, 0, cfg);
	if (!f)
		return TCX_NEXT;
	struct prg_pod *pod = NULL;
	int pr = prg_pod_lookup4(&prg_fastpath_ep, &prg_fastpath_port, cfg->netns, p.daddr, &pod);
	if (pr == PRG_POD_MISS || !pod) {
		count(FP_DIR_RX, FP_R_NOPOD);
		return TCX_NEXT;
	}
	/* The bridge forwards by dst MAC: only the pod's own MAC reaches it. */
	if (pr != PRG_POD_OK || pod->ifindex != f->in_ifindex || !mac_eq(pod->ctr_mac, f->in_mac) ||
	    !mac_eq(p.eth.h_dest, f->in_mac))
		return handover_in(ctx, f, &k, &p, 0, FP_R_STALE);
	if (f->in_ttl_dec || (cfg->flags & FP_C_UNSUP)) {
		count(FP_DIR_RX, FP_R_UNSUP);
		return TCX_NEXT;
	}
	long v = prg_pod_deliver(ctx, f->in_mac, f->in_mac + 6, pod->ifindex);
	if (v < 0) {
		count(FP_DIR_RX, FP_R_DROP);
		return TC_ACT_SHOT;
	}
	count(FP_DIR_RX, FP_R_HIT);
	return v;
}

/* prg_fastpath_lrn_tx4t is prg_fastpath_lrn_tx for an IPv4 frame under BPF_PROG_TEST_RUN, which
 * cannot set tc_index: it takes every frame as handed over (handover_out's tag), so the tests
 * reach learn_dnat (fastpath_nat.h). Never attached. */
SEC("tcx/egress")
int prg_fastpath_lrn_tx4t(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg = fp_config();

	if (!cfg)
		return TCX_NEXT;
	return lrn_tx_u4(ctx, cfg, 1);
}

/* prg_fastpath_lrn_tx6t is prg_fastpath_lrn_tx for an IPv6 frame under BPF_PROG_TEST_RUN, which
 * cannot set tc_index: it takes every frame as handed over (handover_out6's tag), so the tests
 * reach learn_dnat6 (fastpath_nat6.h). Never attached. */
SEC("tcx/egress")
int prg_fastpath_lrn_tx6t(struct __sk_buff *ctx)
{
	struct fp_cfg *cfg = fp_config();
	struct fp_outer o = {};

	if (!cfg)
		return TCX_NEXT;
	outer(ctx, cfg, &o);
	if (!o.vxlan || o.saddr != cfg->vtep || !fp_is_ip6(ctx, FP_TMPL_LEN - sizeof(struct ethhdr)))
		return TCX_NEXT;
	return lrn_tx6(ctx, o.daddr, 1);
}

