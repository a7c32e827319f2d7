/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath_nat6.h: Service NAT for IPv6 flows (included by fastpath6.h after its keys and
 * tables). As fastpath_nat.h does for IPv4: the normal path (kube-proxy's ip6tables/nftables
 * rules, conntrack) translates a pod's connection to an IPv6 ClusterIP:port into one to a
 * backend; handover_out6 records the untranslated key per CPU (prg_fastpath_ho6) and tags the
 * frame, and the underlay's egress learner ties the two (learn_dnat6). The flow stays keyed by
 * what the pod sent, flagged FP_F_DNAT; an FP_F_ALIAS entry under the translated key sends the
 * backend's replies to it; nat6_rewrite replays the translation per packet, both ways.
 *
 * Where the addresses go. fp_flow (the value of both flow tables, pinned, shared with IPv4)
 * has a 32-bit nat_addr, too small for an IPv6 address, and its layout stays as it is so that
 * an attachment's pinned tables keep working across upgrades. The 128-bit address and the
 * port live in a side table, prg_fastpath_nat6, under the same key as the flow6 entry they
 * belong to: a DNAT flow's entry holds its backend, an alias's and a same-node backend's reply
 * flow's (FP_F_SNAT, fastpath_local6.h) the Service address. Entries go
 * with their flow: the sweep of the IPv6 table (sweep6) removes those whose flow is gone in
 * the same run, the agent's forget deletes them with their flows (ctliberal.go), and a flow
 * learned without translation drops its own.
 *
 * Which frame a record belongs to. The handover record is this CPU's last handed-over IPv6
 * frame; the frame the learner sees carries handover_out6's tc_index tag, but a frame the
 * normal path delayed (a neighbour resolution queue) can reach the learner after another
 * frame's handover rewrote the record. So the record also holds what the translation leaves
 * alone of the frame: the flow label and 8 bytes of the L4 segment (TCP: sequence and
 * acknowledgement numbers; UDP: the first payload bytes). A frame that does not match is not
 * the record's: nothing is learned, nothing is marked. One that matches with its source
 * changed was source-NATed: its flow is marked FP_F_NATX and stays on the normal path.
 *
 * Checksums: IPv6 has no header checksum; the TCP/UDP checksum covers the addresses through
 * the pseudo-header, so an address change is one bpf_csum_diff of the 16 bytes applied with
 * BPF_F_PSEUDO_HDR | BPF_F_IPV6 (which also keeps a CHECKSUM_COMPLETE skb's csum right: the
 * address and the check field change by opposite amounts, unlike IPv4's header checksum). A
 * UDP checksum of 0 is invalid over IPv6, and a CHECKSUM_PARTIAL packet's seed can be 0 too,
 * which a BPF program cannot tell apart: such a packet stays on the normal path (about one in
 * 65 536), whose NAT knows the difference.
 *
 * Same-node IPv6 Service flows (a backend on the client's node) use the same record, side
 * table and alias, learned at the receiver's veth instead (fastpath_local6.h); their backend's
 * replies are a flow of their own (FP_F_SNAT) whose side entry holds the Service address.
 */
#ifndef PRG_FASTPATH_NAT6_H
#define PRG_FASTPATH_NAT6_H

/* prg_fastpath_nat6's value: an IPv6 address and port, network order (the words as fp_key6's). */
struct fp_nat6 {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

/* Sized at attach as prg_fastpath_flow6 (flowtable.go): at most one entry per flow6 entry. Not
 * preallocated: only Service flows and their aliases take one. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_FLOWS6);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fp_key6);
	__type(value, struct fp_nat6);
} prg_fastpath_nat6 SEC(".maps");

/* The last IPv6 frame handover_out6 gave the normal path on this CPU: its key and binding. */
struct fp_ho6 {
	struct fp_key6 k;
	__u32 lbl;     /* flow label */
	__u32 bind[2]; /* TCP: sequence and acknowledgement numbers; UDP: the first 8 payload bytes */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_ho6);
} prg_fastpath_ho6 SEC(".maps");

static __always_inline int addr6_eq(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* nat6_bind reads what a Service's translation leaves alone of the IPv6 packet at ip_off (no
 * extension headers: parse6 checked). A short packet reads zeroes (bpf_skb_load_bytes). */
static __always_inline void nat6_bind(struct __sk_buff *ctx, __u32 ip_off, __u8 proto, __u32 *lbl, __u32 *bind)
{
	__u32 w = 0;
	bpf_skb_load_bytes(ctx, ip_off, &w, 4);
	*lbl = bpf_ntohl(w) & 0xfffff;
	bpf_skb_load_bytes(ctx, ip_off + FP_IP6_HLEN + (proto == PRG_IPPROTO_TCP ? 4 : 8), bind, 8);
}

/* nat6_handover is handover_out6's part: record the frame's key for the learner (once: a frame
 * another program tagged keeps its tag) and say a flow with an untranslatable NAT so
 * (FP_R_NAT for a miss). Returns the reason to count. */
static __always_inline __u32 nat6_handover(struct __sk_buff *ctx, const struct fp_flow *f, const struct fp_key6 *k,
					   const struct fp_pkt6 *p, __u32 reason)
{
	__u32 zero = 0;
	struct fp_ho6 *ho = bpf_map_lookup_elem(&prg_fastpath_ho6, &zero);
	if (ho && !ctx->tc_index) {
		ho->k = *k;
		nat6_bind(ctx, sizeof(struct ethhdr), p->proto, &ho->lbl, ho->bind);
		ctx->tc_index = FP_TC_INDEX_OUT;
	}
	if (f && (f->flags & FP_F_NATX) && reason == FP_R_MISS)
		return FP_R_NAT;
	return reason;
}

/* nat6_rewrite replaces the IPv6 address at ip_off + addr_off (8: source, 24: destination),
 * old, with addr, and the L4 port at port_off (0: source, 2: destination), old_port, with port,
 * updating the TCP/UDP checksum incrementally. 0; 1 before anything changed (a helper failed,
 * or a UDP checksum of 0: see above); -1 after. */
static __always_inline int nat6_rewrite(struct __sk_buff *ctx, __u32 ip_off, __u32 addr_off, __u32 port_off, __u8 proto,
					const __u32 *old, const __u32 *addr, __u16 old_port, __u16 port)
{
	__u32 l4 = ip_off + FP_IP6_HLEN;
	__u32 csum = l4 + (proto == PRG_IPPROTO_TCP ? 16 : 6);
	__u64 mangled0 = 0;
	__u32 from[4], to[4];

	if (proto == PRG_IPPROTO_UDP) {
		__u16 c = 0;
		if (bpf_skb_load_bytes(ctx, csum, &c, 2) || !c)
			return 1;
		mangled0 = BPF_F_MARK_MANGLED_0; /* a result of 0 is sent as 0xffff (RFC 8200) */
	}
	__builtin_memcpy(from, old, 16);
	__builtin_memcpy(to, addr, 16);
	__s64 d = bpf_csum_diff(from, 16, to, 16, 0);
	if (d < 0 || bpf_l4_csum_replace(ctx, csum, 0, (__u32)d, BPF_F_PSEUDO_HDR | BPF_F_IPV6 | mangled0))
		return 1;
	if (bpf_skb_store_bytes(ctx, ip_off + addr_off, to, 16, 0))
		return -1;
	if (old_port != port &&
	    (bpf_l4_csum_replace(ctx, csum, old_port, port, mangled0 | sizeof(port)) ||
	     bpf_skb_store_bytes(ctx, l4 + port_off, &port, sizeof(port), 0)))
		return -1;
	return 0;
}

/* nat6_out replays a DNAT flow's translation on the pod's packet (Ethernet at 0): 0 done, 2
 * the flow's backend is not known (re-learn it), 1 / -1 as nat6_rewrite. */
static __always_inline int nat6_out(struct __sk_buff *ctx, const struct fp_key6 *k, const struct fp_pkt6 *p)
{
	struct fp_nat6 *be = bpf_map_lookup_elem(&prg_fastpath_nat6, k);
	if (!be)
		return 2;
	return nat6_rewrite(ctx, sizeof(struct ethhdr), 24, 2, p->proto, p->daddr, be->addr, p->dport, be->port);
}

/* nat6_in is rx6's first look at a frame's key k: 1 when it is an alias (a Service backend's
 * reply): k becomes the pod's flow's (by the Service address) and *be holds the backend;
 * 0 for any other key; FP_R_STALE when an alias lacks its Service address; FP_R_NAT when k is a
 * translated flow's own key: a frame that comes from the Service address itself, which the
 * normal path never sends over the overlay (conntrack reverses the translation on this node):
 * a forgery, left to the normal path (whose conntrack refuses it), without touching the flow. */
static __always_inline int nat6_in(struct fp_key6 *k, struct fp_nat6 *be)
{
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, k);
	if (!f)
		return 0;
	if (f->flags & FP_F_DNAT)
		return FP_R_NAT;
	if (!(f->flags & FP_F_ALIAS))
		return 0;
	struct fp_nat6 *svc = bpf_map_lookup_elem(&prg_fastpath_nat6, k);
	if (!svc)
		return FP_R_STALE;
	__builtin_memcpy(be->addr, k->remote, 16);
	be->port = k->rport;
	__builtin_memcpy(k->remote, svc->addr, 16);
	k->rport = svc->port;
	return 1;
}

/* nat6_reply_ok: flow f (key k, the pod's) is still translated to the backend be the reply
 * comes from. */
static __always_inline int nat6_reply_ok(const struct fp_key6 *k, const struct fp_flow *f, const struct fp_nat6 *be)
{
	if (!f || !(f->flags & FP_F_DNAT))
		return 0;
	struct fp_nat6 *cur = bpf_map_lookup_elem(&prg_fastpath_nat6, k);
	return cur && cur->port == be->port && addr6_eq(cur->addr, be->addr);
}

static int sweep6(void *map, __u32 *key, struct fp_sweep *s);

/* nat6_ho is this CPU's handover record if it is the frame's (its IPv6 header at ip_off, proto
 * its L4): NULL when it is another frame's (nat_ho, fastpath_nat.h, for IPv6). */
static __always_inline struct fp_ho6 *nat6_ho(struct __sk_buff *ctx, __u32 ip_off, __u8 proto)
{
	__u32 zero = 0, lbl, bind[2] = {};
	struct fp_ho6 *ho = bpf_map_lookup_elem(&prg_fastpath_ho6, &zero);
	if (!ho)
		return NULL;
	nat6_bind(ctx, ip_off, proto, &lbl, bind);
	if (lbl != ho->lbl || bind[0] != ho->bind[0] || bind[1] != ho->bind[1])
		return NULL;
	return ho;
}

/* learn_dnat6 is learn_dnat (fastpath_nat.h) for IPv6: a learner's half for a frame
 * handover_out6 tagged whose key k (the frame as translated) is not a flow the fast path handed
 * over; ok is the key the pod sent (a copy of the frame's handover record, nat6_ho). The record's flow is
 * returned to learn into, its backend and the alias written; NULL: nothing to learn. */
static __always_inline struct fp_flow *learn_dnat6(const struct fp_key6 *ok, const struct fp_key6 *k, const struct fp_pkt6 *p,
						   __u32 vtep)
{
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, ok);
	if (!f || (f->flags & FP_F_ALIAS) || !f->out_ttl_seen || f->out_ttl_seen < p->ttl)
		return NULL;
	if (!addr6_eq(ok->local, k->local) || ok->lport != k->lport || ok->proto != k->proto ||
	    (k->proto != PRG_IPPROTO_TCP && k->proto != PRG_IPPROTO_UDP)) {
		/* This frame, translated otherwise (its source): not reproduced. */
		__sync_fetch_and_or(&f->flags, FP_F_NATX);
		__sync_fetch_and_and(&f->flags, ~(FP_F_OUT | FP_F_DNAT));
		f->out_ttl_seen = 0;
		return NULL;
	}
	if (addr6_eq(ok->remote, k->remote) && ok->rport == k->rport)
		return NULL; /* untranslated: the record's flow is the frame's key, which the caller had */
	struct fp_flow *a = bpf_map_lookup_elem(&prg_fastpath_flow6, k);
	if (a && !(a->flags & FP_F_ALIAS))
		return NULL; /* the translated key is a flow of its own: leave both to the normal path */
	if (a) {
		a->vtep = vtep;
		a->seen_ns = bpf_ktime_get_ns();
	} else {
		struct fp_flow na = {.flags = FP_F_ALIAS, .vtep = vtep, .seen_ns = bpf_ktime_get_ns()};
		if (bpf_map_update_elem(&prg_fastpath_flow6, k, &na, BPF_NOEXIST))
			return NULL;
		sweep_arm_at(&prg_fastpath_sweep6, sweep6);
	}
	/* The alias first, then its Service address: a reply meeting the alias alone stays on the
	 * normal path (nat6_in). The backend before the flag (the caller). One value on the stack
	 * for both (the same-node learner's 512 bytes, fastpath_local6.h). */
	struct fp_nat6 v = {.port = ok->rport};
	__builtin_memcpy(v.addr, ok->remote, 16);
	if (bpf_map_update_elem(&prg_fastpath_nat6, k, &v, BPF_ANY))
		return NULL;
	v.port = k->rport;
	__builtin_memcpy(v.addr, k->remote, 16);
	if (bpf_map_update_elem(&prg_fastpath_nat6, ok, &v, BPF_ANY))
		return NULL;
	return f;
}

/* nat6_learn_out is lrn_tx6's lookup of the flow a frame (key k) from this VTEP to vtep
 * teaches: the flow of key k the fast path handed over, or, for a frame handover_out6 tagged
 * (handed) that is not one, the flow whose Service translation it shows (learn_dnat6). The
 * flow's translation flag follows what the normal path did this time (rules can change).
 * NULL: nothing to learn. */
static __always_inline struct fp_flow *nat6_learn_out(struct __sk_buff *ctx, const struct fp_key6 *k,
						      const struct fp_pkt6 *p, __u32 vtep, int handed)
{
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow6, k);
	if (handed && (!f || (f->flags & FP_F_ALIAS) || !f->out_ttl_seen)) {
		struct fp_ho6 *ho = nat6_ho(ctx, FP_TMPL_LEN, p->proto);
		if (!ho)
			return NULL; /* no record, or another frame's */
		struct fp_key6 ok = ho->k;
		f = learn_dnat6(&ok, k, p, vtep);
		if (f) {
			__sync_fetch_and_and(&f->flags, ~FP_F_NATX);
			__sync_fetch_and_or(&f->flags, FP_F_DNAT);
		}
		return f;
	}
	if (!f || !f->out_ttl_seen || f->out_ttl_seen < p->ttl)
		return NULL; /* not a flow the fast path handed over */
	if (f->flags & (FP_F_DNAT | FP_F_NATX | FP_F_SNAT)) { /* SNAT: the caller's local_forget */
		__sync_fetch_and_and(&f->flags, ~(FP_F_DNAT | FP_F_NATX));
		bpf_map_delete_elem(&prg_fastpath_nat6, k);
	}
	return f;
}

/* nat6_sweep_one deletes a side entry whose flow6 entry is gone. */
static long nat6_sweep_one(struct bpf_map *map, struct fp_key6 *k, struct fp_nat6 *v, void *ctx)
{
	if (!bpf_map_lookup_elem(&prg_fastpath_flow6, k))
		bpf_map_delete_elem(map, k);
	return 0;
}

/* nat6_sweep: the side entries of the flows and aliases the sweep just removed, in the same
 * run (sweep6, after the table's). */
static __always_inline void nat6_sweep(void)
{
	bpf_for_each_map_elem(&prg_fastpath_nat6, nat6_sweep_one, NULL, 0);
}

#endif
