// SPDX-License-Identifier: GPL-2.0
/*
 * MFLOW's skb-level pieces on a stock kernel (the IRQ split itself is grosplit.bpf.c, mflow mode).
 *
 *   prg_mflow_dev   tcx ingress of the underlay: "device scaling". The packet has been through
 *                   the NIC stage (skb, GRO) on the IRQ core; before it reaches the VXLAN device
 *                   it is numbered into micro-flows (bpf/mflow.h) and each batch gets a hash
 *                   that the VXLAN device's RPS (rps_cpus = the splitting CPUs, ascending) maps
 *                   to the batch's CPU. bpf_set_hash marks the hash L4 so decapsulation keeps it
 *                   (as falcon). The VXLAN device's receive, the bridge and the veth transmit
 *                   then run on the splitting CPUs in parallel. A GRO super-packet counts as its
 *                   segments and is never cut. Mice get hash 0: RPS leaves them where they are.
 *   prg_mflow_port  tcx egress of a bridge port: "merge" (optional). For a split flow it sets a
 *                   fixed per-flow hash so the container veth's RPS brings every batch back to
 *                   ONE CPU before the transport. The per-CPU backlogs feeding that CPU are still
 *                   unordered relative to each other, so this narrows, not removes, reordering.
 *                   It only reads the flow map: in full-path mode Go points prg_mf_flows at the
 *                   XDP split's prg_gs_mflows (same key and value layout).
 *                   Reorder guard (mf.guard_ooo > 0, bpf/mflow.h): it also watches each split TCP
 *                   flow's sequence numbers there and puts a flow that arrives out of order on
 *                   hold (one path) for a while; the split programs read the hold.
 *
 * The flow key and hash are every program's (struct prg_flow, prg_flow_hash in bpf/parse.h), as
 * in grosplit.bpf.c, so a flow's first batch starts on the same slot in both modes.
 */
#include "common.h"
#include "rps.h"
#include "vxlan.h"
#include "mflow.h"

char LICENSE[] SEC("license") = "GPL";

#define MF_MAX_SLOTS 64
#define TCX_NEXT (-1)

struct mf_cfg {
	__u32 n_cpus;      /* 0 = off: everything untouched */
	__u32 mice_affine; /* 1: mice keep the kernel's hash (RPS spreads them by flow) */
	__u32 merge;       /* 1: prg_mflow_port merges split flows */
	__u16 vxlan_ports[PRG_VXLAN_MAX_PORTS]; /* vxlan.h */
	__u32 cpus[MF_MAX_SLOTS]; /* ascending: the order of the RPS map */
	struct mf_params mf;
	__u32 guard_ooo;     /* reorder guard (bpf/mflow.h): out-of-order segments per window; 0 = off */
	__u32 pad;
	__u64 guard_hold_ns; /* first hold, doubled per further hold up to 16x */
};

struct mf_stats {
	__u64 split;       /* packets (segments) of elephants steered per batch */
	__u64 mice;        /* packets of mice */
	__u64 passed;      /* not VXLAN, not parsed: untouched */
	__u64 batches;
	__u64 merged;      /* packets of split flows merged at a bridge port */
	__u64 holds;       /* reorder guard: flows put on hold */
	__u64 to_cpu[MF_MAX_CPUS];
	__u64 batch_to_cpu[MF_MAX_CPUS];
	__u64 merge_to_cpu[MF_MAX_CPUS];
	__u64 last_hash;   /* debug: the hash written last */
	__u64 last_slot;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mf_cfg);
} prg_mf_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mf_stats);
} prg_mf_stats SEC(".maps");

/* Same type, size and layout as grosplit's prg_gs_mflows, so Go can hand that map in instead. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct prg_flow);
	__type(value, struct mf_flow_state);
} prg_mf_flows SEC(".maps");

#define bound_slot(x) ({ __u32 __v = (x); asm volatile("" : "+r"(__v)); __v & (MF_MAX_SLOTS - 1); })
#define bound_cpu(x) ({ __u32 __v = (x); asm volatile("" : "+r"(__v)); __v & (MF_MAX_CPUS - 1); })

SEC("tcx/ingress")
int prg_mflow_dev(struct __sk_buff *ctx)
{
	__u32 zero = 0;
	struct mf_cfg *cfg = bpf_map_lookup_elem(&prg_mf_cfg, &zero);
	struct mf_stats *st = bpf_map_lookup_elem(&prg_mf_stats, &zero);
	if (!cfg || !st)
		return TCX_NEXT;
	__u32 n = cfg->n_cpus, batch = cfg->mf.batch;
	struct prg_hdrs hd = {};
	struct prg_vxlan vx;
	struct prg_pkt p;
	int r = PRG_NO;
	if (n > 0 && n <= MF_MAX_SLOTS && batch > 0) {
		prg_pkt_tc(&p, ctx);
		PRG_TC_PARSE(r, &p, ctx, prg_vxlan_outer(&p, cfg->vxlan_ports, &vx));
		if (r == PRG_OK)
			PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, vx.inner, 0, &hd));
	}
	if (r != PRG_OK) {
		st->passed++;
		return TCX_NEXT;
	}
	struct prg_flow f = hd.flow;
	struct mf_flow_state zs = {}, *s = bpf_map_lookup_elem(&prg_mf_flows, &f);
	if (!s) {
		bpf_map_update_elem(&prg_mf_flows, &f, &zs, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&prg_mf_flows, &f);
	}
	if (!s) {
		st->passed++;
		return TCX_NEXT;
	}
	__u64 units = ctx->gso_segs ? ctx->gso_segs : 1, seq = 0;
	__u32 fh = prg_flow_hash(&f);
	if (!mf_account(s, &cfg->mf, bpf_ktime_get_coarse_ns(), units, ctx->len, &seq)) {
		st->mice += units;
		if (!cfg->mice_affine)
			bpf_set_hash(ctx, 0); /* stays on this CPU, as without RPS */
		return TCX_NEXT;
	}
	int opens;
	__u32 base = (__u32)(((__u64)fh * n) >> 32);
	__u32 slot = bound_slot(mf_slot(base, seq, units, batch, n, &opens));
	__u32 h = prg_rps_hash(slot, n, fh);
	bpf_set_hash(ctx, h);
	s->last_slot = slot;
	__u32 cpu = bound_cpu(cfg->cpus[slot]);
	st->split += units;
	st->to_cpu[cpu] += units;
	if (opens) {
		s->batches++;
		st->batches++;
		st->batch_to_cpu[cpu]++;
	}
	st->last_hash = h;
	st->last_slot = slot;
	return TCX_NEXT;
}

SEC("tcx/egress")
int prg_mflow_port(struct __sk_buff *ctx)
{
	__u32 zero = 0;
	struct mf_cfg *cfg = bpf_map_lookup_elem(&prg_mf_cfg, &zero);
	struct mf_stats *st = bpf_map_lookup_elem(&prg_mf_stats, &zero);
	if (!cfg || !st)
		return TCX_NEXT;
	__u32 n = cfg->n_cpus;
	struct prg_hdrs hd = {};
	struct prg_pkt p;
	int r;
	if ((!cfg->merge && !cfg->guard_ooo) || n == 0 || n > MF_MAX_SLOTS)
		return TCX_NEXT;
	prg_pkt_tc(&p, ctx);
	PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, 0, 0, &hd));
	if (r != PRG_OK)
		return TCX_NEXT;
	struct prg_flow f = hd.flow;
	struct mf_flow_state *s = bpf_map_lookup_elem(&prg_mf_flows, &f);
	if (s && cfg->guard_ooo && hd.flow.proto == PRG_IPPROTO_TCP && !hd.frag) {
		__u8 *t = prg_at(&p, hd.l4_off, 13); /* ports, seq, ack, data offset */
		if (t) {
			__u32 seq = ((__u32)t[4] << 24) | ((__u32)t[5] << 16) | ((__u32)t[6] << 8) | t[7];
			__u32 hl = hd.l4_off + (t[12] >> 4) * 4, len = ctx->len > hl ? ctx->len - hl : 0;
			if (mf_guard_seg(s, cfg->guard_ooo, cfg->guard_hold_ns, bpf_ktime_get_coarse_ns(), seq, len))
				st->holds++;
		}
	}
	if (!cfg->merge)
		return TCX_NEXT;
	if (!s || !s->elephant) {
		if (!cfg->mice_affine)
			bpf_set_hash(ctx, 0); /* mice: the container stage stays where it was */
		return TCX_NEXT;
	}
	__u32 fh = prg_flow_hash(&f);
	__u32 slot = bound_slot((__u32)(((__u64)fh * n) >> 32));
	__u32 h = prg_rps_hash(slot, n, fh);
	bpf_set_hash(ctx, h);
	__u64 units = ctx->gso_segs ? ctx->gso_segs : 1;
	st->merged += units;
	st->merge_to_cpu[bound_cpu(cfg->cpus[slot])] += units;
	st->last_hash = h;
	st->last_slot = slot;
	return TCX_NEXT;
}
