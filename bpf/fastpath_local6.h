/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath_local6.h: same-node pods' IPv6 flows (flannel layout; included by fastpath6.h).
 * fastpath_local.h for the IPv6 table: two pods of one node talking IPv6 over cni0 are learned
 * at the far end of the normal path (lrn_rx6, tcx egress of the receiver's host-side veth) from
 * a frame whose flow the sender's veth handed over (tx6 recorded the hop limit it had there),
 * and later packets go from the sender's host-side veth straight into the receiver's namespace
 * (bpf_redirect_peer): no bridge, no second veth backlog, no netfilter.
 *
 * Flow fields of a same-node IPv6 flow (FP_F_LOCAL): tmpl[0..12] the MACs the normal path
 * delivered it with, loc_ifindex the receiver's host-side veth, out_ttl_dec the hop limit
 * change the normal path made (0 over the bridge, 1 where the node routes), vtep 0.
 *
 * Not here: a Service between two pods of one node (its DNAT is learned only towards another
 * node, fastpath_nat6.h): a flow translated on the normal path never becomes FP_F_LOCAL and
 * stays there. Extension headers, fragments and ICMPv6 (neighbour discovery) never reach this
 * code: parse6 refuses them first. A pod sending with another pod's source address misses:
 * the flow is bound to the veth it was learned on (tx6's out_ifindex check).
 */
#ifndef PRG_FASTPATH_LOCAL6_H
#define PRG_FASTPATH_LOCAL6_H

/* local_learn6 is local_learn (fastpath_local.h) for an IPv6 frame the normal path delivers to
 * a pod: the sender's flow (handed over at the sender's veth, its hop limit recorded there)
 * becomes FP_F_LOCAL, and the receiver's flow learns its ingress direction. */
static __always_inline void local_learn6(struct __sk_buff *ctx, const struct fp_cfg *cfg, const struct fp_pkt6 *p)
{
	struct fp_key6 k = {}, ki = {};

	key6_out(&k, p);
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
	if (!f || (f->flags & (FP_F_ALIAS | FP_F_DNAT)) || !f->out_ttl_seen || f->out_ttl_seen < p->ttl)
		return; /* not a flow a local pod's veth handed over (or a translated one: normal path) */
	__builtin_memcpy(f->tmpl, p->eth.h_dest, 6);
	__builtin_memcpy(f->tmpl + 6, p->eth.h_source, 6);
	f->loc_ifindex = ctx->ifindex;
	f->vtep = 0;
	f->nat_addr = 0;
	f->nat_port = 0;
	__sync_fetch_and_and(&f->flags, ~(FP_F_SNAT | FP_F_NATX));
	if (f->flags & FP_F_U6) /* it moved from the IPv6 underlay (fastpath_u6.h) */
		__sync_fetch_and_and(&f->flags, ~FP_F_U6);
	__sync_fetch_and_or(&f->flags, FP_F_LOCAL);
	f->out_ttl_dec = f->out_ttl_seen - p->ttl;
	f->out_ttl_seen = 0;
	f->out_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory"); /* the delivery before the flag */
	f->flags |= FP_F_OUT;
	count(FP_DIR_TX, FP_R_LEARN);
	learned_report(&k, sizeof(k), f, p->proto, 1, 0);

	/* The receiver's flow: its ingress direction was delivered by the normal path. */
	key6_in(&ki, p);
	struct fp_flow *r = bpf_map_lookup_elem(&prg_fastpath_flow6, &ki);
	if (!r) {
		struct fp_flow nf = {};
		r = flow_new6(cfg, &ki, &nf, FP_DIR_RX);
		if (!r)
			return;
	}
	if (r->flags & FP_F_ALIAS)
		return;
	flow_reset(r, cfg->gen);
	__builtin_memcpy(r->in_mac, p->eth.h_dest, 6);
	__builtin_memcpy(r->in_mac + 6, p->eth.h_source, 6);
	r->in_ifindex = ctx->ifindex;
	r->in_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory");
	__u32 was = r->flags;
	r->flags |= FP_F_IN;
	learned_report(&ki, sizeof(ki), r, p->proto, 0, was);
}

/* local_tx6 is local_tx (fastpath_local.h) for IPv6: the hop limit change of the normal path
 * (the caller refused a hop limit it would exhaust), the MACs it delivered with,
 * bpf_redirect_peer into the receiving pod, checked in the endpoint table. */
static __always_inline int local_tx6(struct __sk_buff *ctx, const struct fp_cfg *cfg, struct fp_flow *f,
				     struct fp_key6 *k, const struct fp_pkt6 *p)
{
	struct prg_pod *pod = NULL;
	int pr = pod_lookup6(cfg->netns, p->daddr, &pod);
	if (pr != PRG_POD_OK || !pod || pod->ifindex != f->loc_ifindex || !mac_eq(pod->ctr_mac, f->tmpl))
		return handover_out6(f, k, p, ctx, cfg, FP_R_STALE);
	__u8 dec = f->out_ttl_dec;
	if (dec) {
		void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end) {
			if (bpf_skb_pull_data(ctx, sizeof(struct ethhdr) + FP_IP6_HLEN))
				goto err;
			data = (void *)(long)ctx->data;
			end = (void *)(long)ctx->data_end;
			if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end)
				goto err;
		}
		struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
		ip6->hop_limit -= dec;
	}
	long v = prg_pod_deliver(ctx, f->tmpl, f->tmpl + 6, pod->ifindex);
	if (v < 0) {
		count(FP_DIR_TX, FP_R_DROP);
		return TC_ACT_SHOT;
	}
	count(FP_DIR_TX, FP_R_HIT);
	count(FP_DIR_TX, FP_R_LOCAL);
	return v;
err:
	count(FP_DIR_TX, FP_R_ERR);
	return TCX_NEXT;
}

#endif
