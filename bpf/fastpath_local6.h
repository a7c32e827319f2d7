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
 * Services between two pods of one node, as fastpath_local.h does for IPv4: the client's flow
 * (to the ClusterIP) is learned with its DNAT from the handover record (learn_dnat6: backend
 * in prg_fastpath_nat6, the alias under the translated key holding the Service address), and
 * the backend's replies, which conntrack reverses on the bridge (br_netfilter), as a source
 * translation of the backend's own flow (FP_F_SNAT, the Service address and port in its side
 * entry), only where the client's alias confirms it (local_reverse6). Anything else (a
 * hairpin's MASQUERADE) is FP_F_NATX (learn_dnat6), counted "nat", on the normal path. A
 * reply flow due for re-learning waits for the client's flow to be re-learned first
 * (local_reply_due6), as IPv4's does.
 *
 * Extension headers, fragments and ICMPv6 (neighbour discovery) never reach this code: parse6
 * refuses them first. A pod sending with another pod's source address misses: the flow is
 * bound to the veth it was learned on (tx6's out_ifindex check).
 */
#ifndef PRG_FASTPATH_LOCAL6_H
#define PRG_FASTPATH_LOCAL6_H

/* local_reverse6 is local_reverse (fastpath_local.h) for IPv6: is the delivered frame (key k)
 * the backend's reply of a Service connection whose client's DNAT the fast path learned, as the
 * sender's veth handed it over (ok)? The alias under the client's translated key holds the
 * Service address and port the source must become (its side entry). */
static __always_inline int local_reverse6(const struct fp_key6 *ok, const struct fp_key6 *k)
{
	if (!addr6_eq(ok->remote, k->remote) || ok->rport != k->rport || ok->proto != k->proto ||
	    (addr6_eq(ok->local, k->local) && ok->lport == k->lport))
		return 0;
	struct fp_key6 ak = {.lport = ok->rport, .rport = ok->lport, .proto = ok->proto, .ovl = ok->ovl};
	__builtin_memcpy(ak.local, ok->remote, 16);
	__builtin_memcpy(ak.remote, ok->local, 16);
	struct fp_flow *a = bpf_map_lookup_elem(&prg_fastpath_flow6, &ak);
	if (!a || !(a->flags & FP_F_ALIAS))
		return 0;
	struct fp_nat6 *s = bpf_map_lookup_elem(&prg_fastpath_nat6, &ak);
	return s && s->port == k->lport && addr6_eq(s->addr, k->local);
}

/* local_learn6 is local_learn (fastpath_local.h) for an IPv6 frame the normal path delivers to
 * a pod: the sender's flow (handed over at the sender's veth, its hop limit recorded there)
 * becomes FP_F_LOCAL, with a Service's translation where the frame shows one (handed: tagged
 * by handover_out6), and the receiver's flow learns its ingress direction. A subprogram: a
 * stack of its own beside lrn_rx6's. */
static __attribute__((noinline)) int local_learn6(struct __sk_buff *ctx, const struct fp_cfg *cfg, const struct fp_pkt6 *p, int handed)
{
	struct fp_key6 k = {};
	__u32 fl = 0;

	/* A TCP handshake teaches nothing here. Learned from its SYN and SYN-ACK, a connection's
	 * third ACK and data would ride the fast path while its FIN takes the normal path (same-node
	 * flows close there, fastpath_closed.h), where conntrack, having seen only the handshake,
	 * calls it INVALID and kube-proxy's KUBE-FORWARD drops it: each short connection stalled
	 * until the agent's liberal marking (bench crr --ipv6 --via-service --same-node: 1 request/s).
	 * Learned from its first data each way, the connection is established in conntrack. */
	if (p->ctl == FP_TCP_SYN)
		return 0;
	key6_out(&k, p);
	/* The flow's key: the frame's, or the handover record's (a translated frame). The record is
	 * read in place (a stack of 512 bytes has no room for a copy): this CPU's handover_out6 runs
	 * in softirq (tcx ingress), which cannot interrupt this egress program (bottom halves off). */
	const struct fp_key6 *fk = &k;
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
	if (handed && (!f || (f->flags & FP_F_ALIAS) || !f->out_ttl_seen)) {
		struct fp_ho6 *ho = nat6_ho(ctx, sizeof(struct ethhdr), p->proto);
		if (!ho)
			return 0; /* no record, or another frame's */
		fk = &ho->k;
		if (local_reverse6(fk, &k)) { /* the backend's reply: the Service address as source */
			f = bpf_map_lookup_elem(&prg_fastpath_flow6, fk);
			if (!f || (f->flags & FP_F_ALIAS) || !f->out_ttl_seen || f->out_ttl_seen < p->ttl)
				return 0;
			struct fp_nat6 svc = {.port = k.lport};
			__builtin_memcpy(svc.addr, k.local, 16);
			if (bpf_map_update_elem(&prg_fastpath_nat6, fk, &svc, BPF_ANY))
				return 0;
			fl = FP_F_SNAT;
		} else {
			f = learn_dnat6(fk, &k, p, 0);
			if (!f)
				return 0;
			fl = FP_F_DNAT;
		}
	} else if (!f || (f->flags & FP_F_ALIAS) || !f->out_ttl_seen || f->out_ttl_seen < p->ttl) {
		return 0; /* not a flow a local pod's veth handed over */
	} else if (f->flags & (FP_F_DNAT | FP_F_SNAT)) {
		bpf_map_delete_elem(&prg_fastpath_nat6, &k); /* delivered untranslated now */
	}
	__builtin_memcpy(f->tmpl, p->eth.h_dest, 6);
	__builtin_memcpy(f->tmpl + 6, p->eth.h_source, 6);
	f->loc_ifindex = ctx->ifindex;
	f->vtep = 0;
	f->nat_addr = 0; /* IPv6: the translation is in the side entry */
	f->nat_port = 0;
	/* FP_F_U6: it moved from the IPv6 underlay (fastpath_u6.h) */
	__sync_fetch_and_and(&f->flags, ~(FP_F_DNAT | FP_F_SNAT | FP_F_NATX | FP_F_U6));
	__sync_fetch_and_or(&f->flags, FP_F_LOCAL | fl);
	ttl_learned(&f->out_ttl_seen, &f->out_ttl_dec, p->ttl);
	f->out_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory"); /* the delivery before the flag */
	f->flags |= FP_F_OUT;
	count(FP_DIR_TX, FP_R_LEARN);
	learned_report(fk, sizeof(*fk), f, p->proto, 1, 0);

	/* The receiver's flow: its ingress direction was delivered by the normal path. */
	key6_in(&k, p); /* k: the receiver's key from here on */
	struct fp_flow *r = bpf_map_lookup_elem(&prg_fastpath_flow6, &k);
	if (!r) {
		struct fp_flow nf = {};
		r = flow_new6(cfg, &k, &nf, FP_DIR_RX);
		if (!r)
			return 0;
	}
	if (r->flags & FP_F_ALIAS)
		return 0;
	flow_reset(r, cfg->gen);
	__builtin_memcpy(r->in_mac, p->eth.h_dest, 6);
	__builtin_memcpy(r->in_mac + 6, p->eth.h_source, 6);
	r->in_ifindex = ctx->ifindex;
	r->in_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory");
	__u32 was = r->flags;
	r->flags |= FP_F_IN;
	learned_report(&k, sizeof(k), r, p->proto, 0, was);
	return 0;
}

/* local_client6 is the key of the client's flow of a same-node backend's reply (the packet p,
 * its Service address s): the reply's destination, keyed by the Service address. */
static __always_inline void local_client6(struct fp_key6 *ck, const struct fp_pkt6 *p, const struct fp_nat6 *s)
{
	ck->lport = p->dport;
	ck->rport = s->port;
	ck->proto = p->proto;
	ck->ovl = fp_ovl;
	__builtin_memcpy(ck->local, p->daddr, 16);
	__builtin_memcpy(ck->remote, s->addr, 16);
}

/* local_reply_due6 is local_reply_due (fastpath_local.h) for a same-node IPv6 Service
 * backend's reply flow f (key k) due for re-learning: the client's flow is the reply's
 * destination, keyed by the Service address (f's side entry). */
static __always_inline __u32 local_reply_due6(struct __sk_buff *ctx, struct fp_flow *f, const struct fp_key6 *k,
					      const struct fp_pkt6 *p)
{
	struct fp_nat6 *s = bpf_map_lookup_elem(&prg_fastpath_nat6, k);
	struct fp_key6 ck = {};
	if (!s)
		return FP_R_STALE;
	local_client6(&ck, p, s);
	struct bpf_sock_tuple t;
	tuple6(&t, &ck);
	return local_reply_keep(ctx, bpf_map_lookup_elem(&prg_fastpath_flow6, &ck), f->out_ns, &t, sizeof(t.ipv6), ck.proto);
}

/* local_reply_ok6: the client's flow of a same-node backend's reply (the packet p, its Service
 * address s) is still translated to this backend, as nat6_reply_ok checks a remote backend's
 * replies: a backend the client's flow switched from (its conntrack entry gone) is the normal
 * path's to refuse or answer. */
static __always_inline int local_reply_ok6(const struct fp_pkt6 *p, const struct fp_nat6 *s)
{
	struct fp_key6 ck = {};
	struct fp_nat6 be = {.port = p->sport};
	local_client6(&ck, p, s);
	__builtin_memcpy(be.addr, p->saddr, 16);
	return nat6_reply_ok(&ck, bpf_map_lookup_elem(&prg_fastpath_flow6, &ck), &be);
}

/* local_tx6 is local_tx (fastpath_local.h) for IPv6: a Service's translation (the side entry:
 * the backend of the client's flow, the Service address of the backend's reply flow), the hop
 * limit change of the normal path (the caller refused a hop limit it would exhaust), the MACs
 * it delivered with, bpf_redirect_peer into the receiving pod, checked in the endpoint table.
 * The translation goes first: a packet it cannot translate (nat6_rewrite's 1) goes to the
 * normal path unchanged. */
static __always_inline int local_tx6(struct __sk_buff *ctx, const struct fp_cfg *cfg, struct fp_flow *f,
				     struct fp_key6 *k, const struct fp_pkt6 *p)
{
	struct prg_pod *pod = NULL;
	struct fp_nat6 *nt = NULL;
	const __u32 *dst = p->daddr;
	__u32 fl = f->flags & (FP_F_DNAT | FP_F_SNAT);
	if (fl) {
		nt = bpf_map_lookup_elem(&prg_fastpath_nat6, k);
		if (!nt)
			return handover_out6(f, k, p, ctx, cfg, FP_R_STALE);
		if (fl & FP_F_DNAT)
			dst = nt->addr;
		else if (!local_reply_ok6(p, nt))
			return handover_out6(f, k, p, ctx, cfg, FP_R_STALE);
	}
	int pr = pod_lookup6(cfg->netns, dst, &pod);
	if (pr != PRG_POD_OK || !pod || pod->ifindex != f->loc_ifindex || !mac_eq(pod->ctr_mac, f->tmpl))
		return handover_out6(f, k, p, ctx, cfg, FP_R_STALE);
	__u8 dec = f->out_ttl_dec;
	if (dec) {
		void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end &&
		    bpf_skb_pull_data(ctx, sizeof(struct ethhdr) + FP_IP6_HLEN))
			goto err;
	}
	if (nt) {
		int nr = fl & FP_F_DNAT ? nat6_rewrite(ctx, sizeof(struct ethhdr), 24, 2, p->proto, p->daddr, nt->addr, p->dport, nt->port)
					: nat6_rewrite(ctx, sizeof(struct ethhdr), 8, 0, p->proto, p->saddr, nt->addr, p->sport, nt->port);
		if (nr > 0)
			goto err;
		if (nr < 0)
			goto drop;
	}
	if (dec) {
		void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + FP_IP6_HLEN > end)
			goto drop; /* pulled above: only after a rewrite */
		struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
		ip6->hop_limit -= dec;
	}
	long v = prg_pod_deliver(ctx, f->tmpl, f->tmpl + 6, pod->ifindex);
	if (v < 0)
		goto drop;
	count(FP_DIR_TX, FP_R_HIT);
	count(FP_DIR_TX, FP_R_LOCAL);
	return v;
err:
	count(FP_DIR_TX, FP_R_ERR);
	return TCX_NEXT;
drop:
	count(FP_DIR_TX, FP_R_DROP);
	return TC_ACT_SHOT;
}

#endif
