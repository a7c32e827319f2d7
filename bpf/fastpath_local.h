/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath_local.h: same-node pods (flannel layout; included by fastpath.h after
 * fastpath_nat.h). Two pods on one node talk over cni0: the normal path takes a packet through
 * the sender's veth backlog, the bridge (and, for a Service, IP forwarding and the DNAT) to the
 * receiver's veth. Learned as the overlay's flows are, at the far end of that path: the
 * receive learner (prg_fastpath_lrn_rx, tcx egress of the receiver's host-side veth) sees a
 * frame a local pod's veth handed over and records how the normal path delivered it (MACs,
 * TTL change, which veth, the translation). Later packets go from the sender's host-side veth
 * (tcx ingress) straight into the receiver's namespace with bpf_redirect_peer: no bridge, no
 * second veth backlog, no netfilter.
 *
 * Flow fields of a same-node flow (FP_F_LOCAL): tmpl[0..12] the destination and source MAC
 * the normal path delivered it with (what "comes before the IP header" here), loc_ifindex the
 * receiver's host-side veth, vtep 0.
 *
 * Services between two pods of one node: the client's flow is learned with its DNAT
 * (FP_F_DNAT, as fastpath_nat.h does for the overlay, via learn_dnat) and the backend's replies,
 * which conntrack reverses on the bridge (br_netfilter), are learned as a source translation
 * (FP_F_SNAT: source back to the Service address and port) of the backend's own flow, only
 * where the alias of the client's translated flow confirms it. Anything else (a hairpin's
 * MASQUERADE: the source is the node's) is FP_F_NATX, counted "nat", on the normal path.
 */
#ifndef PRG_FASTPATH_LOCAL_H
#define PRG_FASTPATH_LOCAL_H

/* local_forget: the flow left this node (the overlay's learner relearned it), so its template
 * is an overlay template again. */
static __always_inline void local_forget(struct fp_flow *f)
{
	if (f->flags & (FP_F_LOCAL | FP_F_SNAT))
		__sync_fetch_and_and(&f->flags, ~(FP_F_LOCAL | FP_F_SNAT));
}

/* local_reverse: is the delivered frame (key k) the backend's reply of a Service connection
 * whose client's DNAT the fast path learned, as the sender's veth handed it over (ok)? The
 * alias under the client's translated key names the Service address and port the source must
 * become. */
static __always_inline int local_reverse(const struct fp_key *ok, const struct fp_key *k)
{
	if (ok->remote != k->remote || ok->rport != k->rport || ok->proto != k->proto ||
	    (ok->local == k->local && ok->lport == k->lport))
		return 0;
	struct fp_key ak = {.local = ok->remote, .remote = ok->local, .lport = ok->rport, .rport = ok->lport, .proto = ok->proto,
			     .ovl = ok->ovl};
	struct fp_flow *a = bpf_map_lookup_elem(&prg_fastpath_flow, &ak);
	return a && (a->flags & FP_F_ALIAS) && a->nat_addr == k->local && a->nat_port == k->lport;
}

/* local_learn is the receive learner's half for frames a local pod sent (handed: the sender's
 * veth marked it, so prg_fastpath_ho holds the key it had there). */
static __always_inline void local_learn(struct __sk_buff *ctx, const struct fp_cfg *cfg, const struct fp_pkt *p, int handed)
{
	struct fp_key k = {}, ki = {};
	__u32 nat_addr = 0, fl = 0;
	__u16 nat_port = 0;

	if (p->ctl == FP_TCP_SYN)
		return; /* a handshake teaches nothing same-node: see local_learn6 (fastpath_local6.h) */
	key_out(&k, p);
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow, &k);
	if (handed && (!f || (f->flags & FP_F_ALIAS) || !f->out_ttl_seen)) {
		struct fp_ho *ho = nat_ho(ctx, sizeof(struct ethhdr), p->proto);
		if (!ho)
			return; /* no record, or another frame's (fastpath_nat.h) */
		struct fp_key ok = ho->k;
		if (local_reverse(&ok, &k)) {
			f = bpf_map_lookup_elem(&prg_fastpath_flow, &ok);
			if (!f || !f->out_ttl_seen || f->out_ttl_seen < p->ttl)
				return;
			fl = FP_F_SNAT;
			nat_addr = k.local;
			nat_port = k.lport;
		} else {
			f = learn_dnat(ctx, sizeof(struct ethhdr), &k, p, 0);
			if (!f)
				return;
			fl = FP_F_DNAT;
			nat_addr = k.remote;
			nat_port = k.rport;
		}
	} else if (!f || !f->out_ttl_seen || f->out_ttl_seen < p->ttl) {
		return; /* not a flow a local pod's veth handed over */
	}
	__builtin_memcpy(f->tmpl, p->eth.h_dest, 6);
	__builtin_memcpy(f->tmpl + 6, p->eth.h_source, 6);
	f->loc_ifindex = ctx->ifindex;
	f->vtep = 0;
	f->nat_addr = nat_addr;
	f->nat_port = nat_port;
	__sync_fetch_and_and(&f->flags, ~(FP_F_DNAT | FP_F_SNAT | FP_F_NATX));
	__sync_fetch_and_or(&f->flags, FP_F_LOCAL | fl);
	ttl_learned(&f->out_ttl_seen, &f->out_ttl_dec, p->ttl);
	f->out_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory"); /* the delivery before the flag */
	f->flags |= FP_F_OUT;
	count(FP_DIR_TX, FP_R_LEARN);
	learned_report4(&k, fl != 0, f, p->proto, 1, 0);

	/* The receiving pod's flow (its key as it sees the frame) was delivered by the normal path:
	 * its ingress direction is learned, so its replies may take the fast path once their own
	 * egress is learned. */
	key_in(&ki, p);
	struct fp_flow *r = bpf_map_lookup_elem(&prg_fastpath_flow, &ki);
	if (!r) {
		struct fp_flow nf = {};
		r = flow_new(cfg, &ki, &nf, FP_DIR_RX);
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
	learned_report4(&ki, 0, r, p->proto, 0, was);
}

/* local_reply_due: a same-node Service backend's reply flow (FP_F_SNAT) is due for re-learning
 * (*STALE*); it goes to the normal path only once the client's flow was re-learned after it, as
 * begin_in does for a remote backend's replies: should conntrack's entry be gone (flushed,
 * expired), the client's packet re-creates it with its translation, where the reply first would
 * reach the client untranslated (and its RST would end the connection). Bounded: at most 2
 * intervals old. The client's flow: the reply's destination, keyed by the Service address. */
static __always_inline __u32 local_reply_keep(struct __sk_buff *ctx, const struct fp_flow *c, __u64 then,
					      struct bpf_sock_tuple *t, __u32 tsz, __u8 proto)
{
	/* A client flow re-learned after the reply says nothing once conntrack's entry is gone
	 * since (conntrack -F before the agent's watch made the flows due): ask conntrack (t: the
	 * client's connection), as begin_in does for a remote backend's reply. */
	if (c && bpf_ktime_get_coarse_ns() - then <= 2 * FP_REVALIDATE_NS && (c->out_ns <= then || !ct_known(ctx, t, tsz, proto)))
		return FP_R_HIT;
	return FP_R_STALE;
}

static __always_inline __u32 local_reply_due(struct __sk_buff *ctx, struct fp_flow *f, const struct fp_pkt *p)
{
	struct fp_key ck = {.local = p->daddr, .remote = f->nat_addr, .lport = p->dport, .rport = f->nat_port, .proto = p->proto,
			     .ovl = fp_ovl};
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = ck.local;
	t.ipv4.daddr = ck.remote;
	t.ipv4.sport = ck.lport;
	t.ipv4.dport = ck.rport;
	return local_reply_keep(ctx, bpf_map_lookup_elem(&prg_fastpath_flow, &ck), f->out_ns, &t, sizeof(t.ipv4), ck.proto);
}

/* local_tx delivers a learned same-node flow's packet (at the sender's host-side veth, tcx
 * ingress) to the receiving pod: the translation and TTL change of the normal path, the MACs
 * it delivered with, bpf_redirect_peer into the pod. The receiver is checked in the endpoint
 * table (a vanished or replaced pod sends the packet back to the normal path, to be relearned). */
static __always_inline int local_tx(struct __sk_buff *ctx, const struct fp_cfg *cfg, struct fp_flow *f,
				    struct fp_key *k, const struct fp_pkt *p)
{
	__u32 dst = (f->flags & FP_F_DNAT) ? f->nat_addr : p->daddr;
	struct prg_pod *pod = NULL;
	int pr = prg_pod_lookup4(&prg_fastpath_ep, &prg_fastpath_port, cfg->netns, dst, &pod);
	if (pr != PRG_POD_OK || !pod || pod->ifindex != f->loc_ifindex || !mac_eq(pod->ctr_mac, f->tmpl))
		return handover_out(f, k, p, ctx, FP_R_STALE);
	if (f->out_ttl_dec) {
		void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
		if (data + sizeof(struct ethhdr) + sizeof(struct iphdr) > end) {
			if (bpf_skb_pull_data(ctx, sizeof(struct ethhdr) + sizeof(struct iphdr))) {
				count(FP_DIR_TX, FP_R_ERR);
				return TCX_NEXT;
			}
			data = (void *)(long)ctx->data;
			end = (void *)(long)ctx->data_end;
			if (data + sizeof(struct ethhdr) + sizeof(struct iphdr) > end) {
				count(FP_DIR_TX, FP_R_ERR);
				return TCX_NEXT;
			}
		}
		ttl_sub_ip(data + sizeof(struct ethhdr), f->out_ttl_dec);
	}
	int nr = 0;
	if (f->flags & FP_F_DNAT)
		nr = nat_rewrite(ctx, sizeof(struct ethhdr), 16, 2, p->proto, p->daddr, f->nat_addr, p->dport, f->nat_port);
	else if (f->flags & FP_F_SNAT)
		nr = nat_rewrite(ctx, sizeof(struct ethhdr), 12, 0, p->proto, p->saddr, f->nat_addr, p->sport, f->nat_port);
	if (nr)
		goto drop; /* the TTL already changed */
	long v = prg_pod_deliver(ctx, f->tmpl, f->tmpl + 6, pod->ifindex);
	if (v < 0)
		goto drop;
	count(FP_DIR_TX, FP_R_HIT);
	count(FP_DIR_TX, FP_R_LOCAL);
	return v;
drop:
	count(FP_DIR_TX, FP_R_DROP);
	return TC_ACT_SHOT;
}

#endif
