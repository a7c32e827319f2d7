/* SPDX-License-Identifier: GPL-2.0 */
/*
 * MFLOW micro-flow accounting shared by the XDP split (grosplit.bpf.c, full-path scaling) and
 * the skb-level split (mflow.bpf.c, device scaling).
 *
 * Elephant detection: MFLOW splits only "identified (elephant) flows" and never says how they
 * are identified. Here a flow is an elephant while its rate over the last full window is at or
 * above a threshold in packets/s or bits/s (either one; a threshold of 0 is off, both 0 makes
 * every flow an elephant). A flow is demoted only when it falls below half of every threshold
 * it crossed, so a flow near the threshold does not flap: each flip between the normal path and
 * the split can reorder a few packets.
 *
 * Micro-flows: while a flow is an elephant, its packets are numbered (seq); packet seq belongs
 * to batch seq / batch and batches rotate round-robin over the n splitting slots, starting at
 * the flow's hashed slot: slot = (base + seq / batch) % n.
 *
 * Several CPUs may see one flow (a veth underlay runs XDP on each sender's CPU), so seq is
 * taken with an atomic add; the window fields are updated without atomics: a lost update only
 * blurs a rate estimate, it never misroutes a packet.
 *
 * Time is the coarse clock (bpf_ktime_get_coarse_ns, one jiffy's resolution): a fine clock read
 * per packet cost ~35 ns of the program's budget (issue 12), and a rate window is never shorter
 * than a tick anyway, since a window closes on the first packet after it elapsed.
 *
 * internal/datapath/mflow/model.go mirrors mf_account and mf_slot; the tests compare them.
 */
#ifndef PEREGRINE_MFLOW_H
#define PEREGRINE_MFLOW_H

#define MF_MAX_CPUS 256 /* CPU ids the per-target batch counters cover */

/* Per-flow state, the value of the flow maps. Field order is the Go structs' order. */
struct mf_flow_state {
	__u64 first_ns;   /* when the flow was first seen */
	__u64 last_ns;    /* last packet */
	__u64 win_start;  /* start of the current rate window */
	__u64 win_pkts;   /* packets in the current window */
	__u64 win_bytes;  /* bytes in the current window */
	__u64 rate_pps;   /* rate of the last full window */
	__u64 rate_bps;   /* bits/s of the last full window */
	__u64 pkts;       /* every packet seen */
	__u64 bytes;
	__u64 seq;        /* packets numbered while an elephant (the split ones) */
	__u64 batches;    /* batches started */
	__u32 elephant;   /* 1 while split */
	__u32 last_slot;  /* slot of the last split packet */
	__u32 promotions; /* mouse -> elephant transitions (each may reorder a few packets) */
	__u32 demotions;
};

/* Settings of the accounting; embedded in each program's config. */
struct mf_params {
	__u32 batch;       /* packets per micro-flow, >= 1 */
	__u32 pad;
	__u64 eleph_pps;   /* 0 = no packet-rate test */
	__u64 eleph_bps;   /* 0 = no bit-rate test */
	__u64 window_ns;   /* rate window */
};

/* mf_elephant_now applies the thresholds with hysteresis (see above). */
static __always_inline __u32 mf_elephant_now(const struct mf_params *p, __u32 was, __u64 pps, __u64 bps)
{
	if (p->eleph_pps == 0 && p->eleph_bps == 0)
		return 1;
	if (!was)
		return (p->eleph_pps && pps >= p->eleph_pps) || (p->eleph_bps && bps >= p->eleph_bps);
	/* Stay an elephant while at or above half of any threshold that is set. */
	return (p->eleph_pps && pps * 2 >= p->eleph_pps) || (p->eleph_bps && bps * 2 >= p->eleph_bps);
}

/*
 * mf_account counts one packet of `units` packets (a GRO super-packet counts its segments) and
 * `bytes` bytes at time now. It returns 1 and sets *seq to the packet's number when the flow is
 * split, 0 when the packet takes the normal path. A new state (all zero) starts a mouse.
 */
static __always_inline int mf_account(struct mf_flow_state *s, const struct mf_params *p,
				      __u64 now, __u64 units, __u64 bytes, __u64 *seq)
{
	if (s->first_ns == 0) {
		s->first_ns = now;
		s->win_start = now;
		s->elephant = mf_elephant_now(p, 0, 0, 0); /* thresholds off: split from packet one */
		if (s->elephant)
			s->promotions = 1;
	}
	__u64 el = now - s->win_start;
	if (el >= p->window_ns && el > 0) {
		s->rate_pps = s->win_pkts * 1000000000ULL / el;
		s->rate_bps = s->win_bytes * 8000000000ULL / el;
		__u32 e = mf_elephant_now(p, s->elephant, s->rate_pps, s->rate_bps);
		if (e && !s->elephant)
			s->promotions++;
		if (!e && s->elephant)
			s->demotions++;
		s->elephant = e;
		s->win_start = now;
		s->win_pkts = 0;
		s->win_bytes = 0;
	}
	s->win_pkts += units;
	s->win_bytes += bytes;
	s->pkts += units;
	s->bytes += bytes;
	s->last_ns = now;
	if (!s->elephant)
		return 0;
	*seq = __sync_fetch_and_add(&s->seq, units);
	return 1;
}

/* mf_slot is the slot of packets seq..seq+units-1 of a flow whose hashed slot is base, over n
 * slots: the slot of the first one (a GRO super-packet cannot be cut). *opens says whether the
 * packet opens a batch, i.e. holds its first packet (for the per-CPU batch counters). */
static __always_inline __u32 mf_slot(__u32 base, __u64 seq, __u64 units, __u32 batch, __u32 n, int *opens)
{
	__u64 b = seq / batch;
	*opens = (seq % batch) == 0 || b != (seq + units - 1) / batch;
	return (__u32)((base + b) % n);
}

#endif
