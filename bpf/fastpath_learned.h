/* SPDX-License-Identifier: GPL-2.0 */
/* The learners' reports of TCP flows due for liberal conntrack tracking (ctliberal.go).
 *
 * The agent marks the conntrack entry of every TCP flow the fast path carries both ways liberal,
 * within a second of its learn and again after each egress re-learn (a new out_ns: conntrack's
 * entry may be a new one). Rather than walk the whole flow table every second to find them (a
 * cost that grows with the table: ~23 ms a walk at 78 643 entries), the agent reads them here:
 * the learners push the key of each TCP flow that becomes learned both ways, or whose egress is
 * re-learned, into prg_fastpath_learned, a ring it drains once a second. A record is the flow's
 * key as the table holds it: struct fp_key (16 bytes, prg_fastpath_flow) or struct fp_key6 (40
 * bytes, prg_fastpath_flow6), told apart by length. A record the ring has no room for is counted
 * in prg_fastpath_learned_lost (index 0: IPv4, 1: IPv6): the agent then walks that table once,
 * so the marking never depends on the ring. UDP, ICMP and alias entries push nothing.
 */
#ifndef PRG_FASTPATH_LEARNED_H
#define PRG_FASTPATH_LEARNED_H

/* 1 MiB: ~43 000 IPv4 records (16 bytes and an 8-byte header), a second's worth of new
 * connections at rates far beyond what a node's normal path sets up. */
#define FP_LEARNED_RING (1 << 20)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FP_LEARNED_RING);
} prg_fastpath_learned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} prg_fastpath_learned_lost SEC(".maps");

/* learned_report follows a learn of flow f, stored under key k (klen bytes), protocol proto: a
 * TCP flow learned both ways is pushed when its egress direction was (re)learned (out), or when
 * this learn completed it (was: its flags before the learn). No wakeup: the agent drains the ring
 * on its own tick, so a learn costs no irq_work. */
static __always_inline void learned_report(const void *k, __u32 klen, const struct fp_flow *f, __u8 proto, int out,
					   __u32 was)
{
	const __u32 both = FP_F_OUT | FP_F_IN;

	if (proto != PRG_IPPROTO_TCP || (f->flags & (FP_F_ALIAS | both)) != both)
		return;
	if (!out && (was & both) == both)
		return; /* an ingress re-learn: conntrack's entry is the one marked at the egress learn */
	if (bpf_ringbuf_output(&prg_fastpath_learned, (void *)k, klen, BPF_RB_NO_WAKEUP)) {
		__u32 i = klen != sizeof(struct fp_key);
		__u64 *n = bpf_map_lookup_elem(&prg_fastpath_learned_lost, &i);
		if (n)
			*n += 1;
	}
}

/* learned_report4 is learned_report for an IPv4 flow: under k, or where the learner followed a
 * translation (via_ho: a Service's DNAT, a same-node backend's reply), under the key the pod sent,
 * the handover record's (prg_fastpath_ho, fastpath_nat.h). */
static __always_inline void learned_report4(const struct fp_key *k, int via_ho, const struct fp_flow *f, __u8 proto,
					    int out, __u32 was)
{
	if (via_ho) {
		__u32 zero = 0;
		struct fp_ho *ho = bpf_map_lookup_elem(&prg_fastpath_ho, &zero);
		if (!ho)
			return;
		k = &ho->k;
	}
	learned_report(k, sizeof(*k), f, proto, out, was);
}

#endif
