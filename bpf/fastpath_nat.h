/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath_nat.h: Service NAT for the fast path (included by fastpath.bpf.c after its flow
 * types and maps). The normal path (kube-proxy's rules, conntrack) translates a pod's
 * connection to a ClusterIP:port into one to a backend; the learners at the far end see the
 * translated frame. handover_out records the untranslated key per CPU and marks the frame, and
 * the underlay's egress learner ties the two (learn_dnat). The flow stays keyed by what the pod
 * sent, with the backend (FP_F_DNAT); an alias entry under the translated key sends the
 * backend's replies to it. nat_rewrite replays the translation on each packet.
 */
#ifndef PRG_FASTPATH_NAT_H
#define PRG_FASTPATH_NAT_H

/* The last frame handover_out gave the normal path on this CPU: its (untranslated) key. A
 * frame crosses the normal path from the pod's veth to the underlay synchronously on one CPU, so
 * when the egress learner sees a frame with FP_TC_INDEX_OUT, this is that frame's record. */
struct fp_ho {
	struct fp_key k;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_ho);
} prg_fastpath_ho SEC(".maps");

/* Which frame the record belongs to. The frame the learner sees carries handover_out's tc_index
 * tag, but a frame the normal path delayed (a neighbour resolution queue) can reach the learner
 * after another frame's handover rewrote the record. So handover_out also keeps what the
 * translation leaves alone of its frame: the IPv4 identification and 8 bytes of the L4 segment
 * (TCP: sequence and acknowledgement numbers; UDP: the first payload bytes), as fastpath_nat6.h
 * does with the flow label. A frame that does not match is not the record's: nothing is learned,
 * nothing is marked. In a map of its own beside prg_fastpath_ho, whose layout upgrades in place
 * keep (repair.go laterMaps). */
struct fp_hob {
	__u32 bind[3]; /* the identification (network order, widened), then the 8 L4 bytes */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_hob);
} prg_fastpath_hob SEC(".maps");

/* nat_bind reads the binding of the IPv4 packet at ip_off (a 20-byte header assumed on both
 * sides alike: options, which the translation leaves alone, shift both reads the same). A short
 * packet reads zeroes. */
static __always_inline void nat_bind(struct __sk_buff *ctx, __u32 ip_off, __u8 proto, __u32 *b)
{
	__u16 id = 0;

	b[1] = 0;
	b[2] = 0;
	bpf_skb_load_bytes(ctx, ip_off + 4, &id, sizeof(id));
	b[0] = id;
	bpf_skb_load_bytes(ctx, ip_off + sizeof(struct iphdr) + (proto == PRG_IPPROTO_TCP ? 4 : 8), &b[1], 8);
}

/* nat_ho is this CPU's handover record if it is the frame's (its IPv4 header at ip_off, proto
 * its L4): NULL when it is another frame's. */
static __always_inline struct fp_ho *nat_ho(struct __sk_buff *ctx, __u32 ip_off, __u8 proto)
{
	__u32 zero = 0, b[3];
	struct fp_ho *ho = bpf_map_lookup_elem(&prg_fastpath_ho, &zero);
	struct fp_hob *hb = bpf_map_lookup_elem(&prg_fastpath_hob, &zero);

	if (!ho || !hb)
		return NULL;
	nat_bind(ctx, ip_off, proto, b);
	if (b[0] != hb->bind[0] || b[1] != hb->bind[1] || b[2] != hb->bind[2])
		return NULL;
	return ho;
}

/* nat_rewrite replaces a packet's IPv4 address at ip_off + addr_off (16: destination, 12:
 * source) with addr and the L4 port at l4_off + port_off with port, updating the IPv4 and L4
 * checksums incrementally (the address is in the L4 pseudo-header; a CHECKSUM_PARTIAL packet
 * has only that part in its check field, which the helpers know). 0, or -1 if a helper failed
 * (1: before anything changed). */
static __always_inline int nat_rewrite(struct __sk_buff *ctx, __u32 ip_off, __u32 addr_off, __u32 port_off,
				       __u8 proto, __u32 old_addr, __u32 addr, __u16 old_port, __u16 port)
{
	__u32 l4 = ip_off + sizeof(struct iphdr);
	__u32 csum = l4 + (proto == PRG_IPPROTO_TCP ? 16 : 6);
	__u64 mangled0 = proto == PRG_IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0; /* UDP: 0 is "none" */

	if (bpf_l4_csum_replace(ctx, csum, old_addr, addr, BPF_F_PSEUDO_HDR | mangled0 | sizeof(addr)))
		return 1;
	if (bpf_l3_csum_replace(ctx, ip_off + 10, old_addr, addr, sizeof(addr)) ||
	    bpf_skb_store_bytes(ctx, ip_off + addr_off, &addr, sizeof(addr), 0))
		return -1;
	if (old_port != port &&
	    (bpf_l4_csum_replace(ctx, csum, old_port, port, mangled0 | sizeof(port)) ||
	     bpf_skb_store_bytes(ctx, l4 + port_off, &port, sizeof(port), 0)))
		return -1;
	return 0;
}

/* learn_dnat is the egress learner's half for a frame handover_out marked whose key (k, the
 * frame as translated, p its headers) is not a flow the fast path handed over: the handover
 * record holds the key the pod sent. A destination translation (a Service's DNAT, port kept or
 * changed) of TCP/UDP with the pod's own source address and port is reproduced: the alias is
 * written and the flow (to learn into) returned (the frame's IPv4 header at ip_off: the record
 * must be this frame's, nat_ho). Anything else (source NAT, ...) marks the flow
 * FP_F_NATX, so it stays on the normal path, counted as "nat". NULL: nothing to learn. */
static __always_inline struct fp_flow *learn_dnat(struct __sk_buff *ctx, __u32 ip_off, const struct fp_key *k,
						  const struct fp_pkt *p, __u32 vtep)
{
	struct fp_ho *ho = nat_ho(ctx, ip_off, p->proto);
	if (!ho)
		return NULL; /* no record, or another frame's */
	struct fp_key ok = ho->k;
	struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow, &ok);
	if (!f || !f->out_ttl_seen || f->out_ttl_seen < p->ttl)
		return NULL;
	if (ok.local != k->local || ok.lport != k->lport || ok.proto != k->proto ||
	    (k->proto != PRG_IPPROTO_TCP && k->proto != PRG_IPPROTO_UDP)) {
		__sync_fetch_and_or(&f->flags, FP_F_NATX);
		__sync_fetch_and_and(&f->flags, ~(FP_F_OUT | FP_F_DNAT));
		f->out_ttl_seen = 0;
		return NULL;
	}
	/* The translated view points back at the flow, for the replies (begin_in). */
	struct fp_flow *a = bpf_map_lookup_elem(&prg_fastpath_flow, k);
	if (a && !(a->flags & FP_F_ALIAS))
		return NULL; /* the translated key is a flow of its own: leave both to the normal path */
	if (a) { /* rewritten in place */
		a->nat_addr = ok.remote;
		a->nat_port = ok.rport;
		a->vtep = vtep;
		a->seen_ns = bpf_ktime_get_ns();
		return f;
	}
	struct fp_flow na = {.flags = FP_F_ALIAS, .nat_addr = ok.remote, .nat_port = ok.rport, .vtep = vtep,
			     .seen_ns = bpf_ktime_get_ns()};
	if (bpf_map_update_elem(&prg_fastpath_flow, k, &na, BPF_NOEXIST))
		return NULL;
	sweep_arm();
	return f;
}

#endif
