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
 * Reorder guard: the merge point (prg_mflow_port, tcx egress of the pod's host-side veth, the
 * last stage before the pod's transport) watches each split TCP flow's sequence numbers. A
 * segment that starts below the highest sequence end already seen arrived out of order; when a
 * flow gathers guard_ooo of them within one rate window, the flow is held on one path (taken as
 * a mouse) for guard_hold_ns, doubled on every further hold up to 16x, so a flow the split keeps
 * reordering spends most of its time unsplit and is tried again now and then. TCP pays for each
 * out-of-order batch with SACK processing and, beyond RACK's reordering window (min_rtt/4, a few
 * µs on a LAN), spurious retransmits; the guard keeps that from eating the split's gain.
 *
 * The models in mflow/fuzz_test.go and grosplit/mflow_test.go mirror mf_account and mf_slot.
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
	/* Reorder guard (written at the merge point, read by mf_account). */
	__u64 hold_until; /* coarse ns: until then the flow takes the normal path */
	__u32 top_seq;    /* highest TCP sequence end seen at the merge point */
	__u32 ooo;        /* out-of-order segments there in the current rate window */
	__u32 ooo_total;  /* out-of-order segments there, all time */
	__u32 holds;      /* times the guard put the flow back on one path */
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
		s->ooo = 0;
	}
	s->win_pkts += units;
	s->win_bytes += bytes;
	s->pkts += units;
	s->bytes += bytes;
	s->last_ns = now;
	if (!s->elephant || now < s->hold_until)
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

/* mf_guard_seg records one TCP segment of a split flow at the merge point: seq is its first
 * sequence number, len its payload length (host order). Returns 1 when it puts the flow on hold. */
static __always_inline int mf_guard_seg(struct mf_flow_state *s, __u32 guard_ooo, __u64 hold_ns, __u64 now,
					__u32 seq, __u32 len)
{
	__u32 end = seq + len;
	if (len == 0)
		return 0; /* a pure ACK says nothing about order */
	if (s->top_seq == 0 && s->ooo_total == 0) {
		s->top_seq = end;
		return 0;
	}
	/* Only a split flow's disorder counts: held or a mouse, it is on one path (a retransmit
	 * then is TCP's own business), but the top is kept current for when it splits again. */
	if ((__s32)(seq - s->top_seq) < 0 && s->elephant && now >= s->hold_until) {
		s->ooo_total++;
		if (guard_ooo && ++s->ooo >= guard_ooo && now >= s->hold_until) {
			__u32 sh = s->holds < 4 ? s->holds : 4;
			s->holds++;
			s->ooo = 0;
			s->hold_until = now + (hold_ns << sh);
			return 1;
		}
	}
	if ((__s32)(end - s->top_seq) > 0)
		s->top_seq = end;
	return 0;
}

#endif
