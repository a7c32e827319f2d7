// SPDX-License-Identifier: GPL-2.0
/*
 * grosplit: move skb allocation and GRO of the NIC stage off the IRQ core.
 *
 * FALCON's GRO split and MFLOW's IRQ split cut the first (NIC) receive stage in two. On a stock
 * kernel the closest cut is XDP + BPF_MAP_TYPE_CPUMAP: this program runs in the driver's NAPI
 * poll on raw frames (no skb yet) and redirects each frame into the cpumap entry of a split CPU.
 * That CPU's cpumap kthread builds the skb, runs GRO (6.x cpumap entries carry a gro_node) and
 * the rest of the stack. The IRQ core keeps only the driver poll and this program.
 *
 * CPU choice:
 *   - flow affinity (batch == 0): slot = reciprocal_scale(hash(5-tuple), n). One flow always
 *     lands on one CPU, so the split never reorders it. For VXLAN frames (outer UDP dst port in
 *     the configured set, I flag set: bpf/vxlan.h) the *inner* 5-tuple is hashed, so inner flows
 *     spread even when the outer tuple is shared; an inner frame that is not IP (ARP...) falls
 *     back to the outer tuple. Up to two VLAN tags are skipped, outer and inner.
 *   - micro-flows (batch == B > 0, MFLOW): a per-flow packet counter; consecutive batches of B
 *     packets rotate round-robin over the slots, starting at the flow's hashed slot. This DOES
 *     reorder across batches by design: stock kernels have no in-order reassembly point.
 *   - MFLOW with elephant detection (cfg.mflow == 1, internal/datapath/mflow): micro-flows as
 *     above, but only for flows whose rate makes them elephants (bpf/mflow.h); a mouse's frames
 *     pass (the normal path) or, with mice_affine, keep flow affinity. Per-flow state lives in
 *     prg_gs_mflows, and the per-target batch counters say how the batches spread.
 * Parsing, the flow key and the hash are bpf/parse.h's; IP fragments hash without ports (ports=0),
 * so every fragment of a datagram stays together.
 * Anything not understood (non-IP, short, truncated, bad header lengths) gets XDP_PASS and stays
 * on the IRQ core untouched. A target CPU without a cpumap entry (the CPU set changing under
 * traffic) also passes: the program never drops a frame.
 *
 * The Go model (internal/datapath/grosplit/model_test.go) mirrors the slot math.
 */
#include "common.h"
#include "rps.h"
#include "vxlan.h"
#include "mflow.h"

char LICENSE[] SEC("license") = "GPL";

#define GS_MAX_SLOTS 64  /* CPUs in one split set */
#define GS_MAX_CPUS 256  /* CPU ids the per-target counters cover */

/* Live configuration, one array entry written by Go. Field order is the Go struct's order. */
struct gs_cfg {
	__u32 n_cpus;              /* 0 = split off: every frame passes */
	__u32 batch;               /* 0 = flow affinity; B > 0 = micro-flows of B packets */
	__u32 cpumap_id;           /* kernel id of prg_gs_cpus: the drop tracepoint filters on it */
	__u16 vxlan_ports[PRG_VXLAN_MAX_PORTS]; /* vxlan.h */
	__u32 cpus[GS_MAX_SLOTS];  /* slot -> CPU id (a key of prg_gs_cpus) */
	/* MFLOW (appended so the fields above keep their offsets) */
	__u32 mflow;               /* 1: elephant-gated micro-flows with mf below; batch is ignored */
	__u32 mice_affine;         /* 1: mice keep flow affinity on the split CPUs; 0: they pass */
	struct mf_params mf;
	/* Ring guard (mflow): a split CPU whose ring holds ring_guard frames or more is skipped for
	 * the next slot; with every ring that full the frame passes. 0 = off. */
	__u32 ring_guard;
	__u32 pad_guard;
};

/* Per-CPU (the CPU running XDP) counters. Field order is the Go struct's order. */
struct gs_stats {
	__u64 redirected;          /* frames handed to a split CPU's cpumap queue */
	__u64 passed;              /* frames left on this CPU (XDP_PASS), misses included */
	__u64 missed;              /* of passed: the chosen CPU had no cpumap entry */
	__u64 dropped;             /* frames the cpumap dropped at enqueue (ring full), from xdp:xdp_cpumap_enqueue */
	__u64 vxlan;               /* of redirected: hashed on the inner 5-tuple */
	__u64 last_hash;           /* debug: flow hash of the last redirected frame */
	__u64 last_slot;           /* debug: its slot in cfg.cpus */
	__u64 last_cpu;            /* debug: its target CPU */
	__u64 to_cpu[GS_MAX_CPUS]; /* redirected, by target CPU id */
	/* MFLOW (cfg.mflow) */
	__u64 mice;                /* frames of flows below the elephant threshold */
	__u64 batches;             /* micro-flow batches started */
	__u64 batch_to_cpu[GS_MAX_CPUS]; /* batches started, by target CPU id */
	__u64 diverted;            /* frames sent to another split CPU because their ring was nearly full */
	__u64 overflow;            /* frames passed because every split CPU's ring was nearly full */
};

/* Ring occupancy per split CPU for the guard: enq counts frames redirected to it, deq frames its
 * cpumap kthread took (prg_gs_deq) plus frames the cpumap dropped at enqueue. */
struct gs_ring {
	__u64 enq;
	__u64 deq;
};

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, 1); /* Go sets it to the possible CPU count before load */
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} prg_gs_cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gs_cfg);
} prg_gs_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gs_stats);
} prg_gs_stats SEC(".maps");

/* Micro-flow packet counters (batch mode only). LRU: idle flows age out on their own. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct prg_flow);
	__type(value, __u64);
} prg_gs_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GS_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct gs_ring);
} prg_gs_rings SEC(".maps");

/* MFLOW per-flow state (cfg.mflow only): rate window, elephant flag, micro-flow numbering. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct prg_flow);
	__type(value, struct mf_flow_state);
} prg_gs_mflows SEC(".maps");

/*
 * gs_flow_of builds the flow key of a frame: the outer 5-tuple, or the inner one for VXLAN (*vx
 * set). PRG_OK or a reason to pass the frame.
 */
static __always_inline int gs_flow_of(const struct prg_pkt *p, const struct gs_cfg *cfg,
				      struct prg_flow *f, int *vx)
{
	struct prg_hdrs out = {}, in = {};
	struct prg_vxlan v;
	int r;

	*vx = 0;
	if ((r = prg_parse_frame(p, 0, 2, &out)) != PRG_OK)
		return r;
	*f = out.flow;
	if (prg_vxlan_of(p, &out, cfg->vxlan_ports, &v) != PRG_OK)
		return PRG_OK;
	r = prg_parse_frame(p, v.inner, 2, &in);
	if (r == PRG_NOTIP)
		return PRG_OK; /* inner ARP and the like: the outer tuple is a fine per-flow key */
	if (r != PRG_OK)
		return r;
	*f = in.flow;
	*vx = 1;
	return PRG_OK;
}

static __always_inline __u32 gs_slot(__u32 hash, __u32 n)
{
	return (__u32)(((__u64)hash * n) >> 32); /* reciprocal_scale, as RPS does */
}

SEC("xdp.frags")
int prg_grosplit(struct xdp_md *ctx)
{
	struct prg_pkt p;
	__u32 zero = 0;

	struct gs_stats *st = bpf_map_lookup_elem(&prg_gs_stats, &zero);
	struct gs_cfg *cfg = bpf_map_lookup_elem(&prg_gs_cfg, &zero);
	if (!st || !cfg)
		return XDP_PASS;
	__u32 n = cfg->n_cpus;
	if (n == 0 || n > GS_MAX_SLOTS)
		goto pass;

	struct prg_flow f = {};
	int vx;
	prg_pkt_xdp(&p, ctx);
	if (gs_flow_of(&p, cfg, &f, &vx) != PRG_OK)
		goto pass;

	__u32 h = prg_flow_hash(&f);
	__u32 slot = gs_slot(h, n);
	__u32 batch = cfg->batch; /* read once: Go may rewrite the config under us */
	int opens = 0;
	if (cfg->mflow) {
		__u32 mb = cfg->mf.batch;
		if (mb == 0)
			goto pass;
		struct mf_flow_state zero_state = {}, *s = bpf_map_lookup_elem(&prg_gs_mflows, &f);
		if (!s) {
			bpf_map_update_elem(&prg_gs_mflows, &f, &zero_state, BPF_NOEXIST);
			s = bpf_map_lookup_elem(&prg_gs_mflows, &f);
		}
		if (!s)
			goto pass;
		__u64 seq = 0;
		__u64 bytes = bpf_xdp_get_buff_len(ctx);
		if (!mf_account(s, &cfg->mf, bpf_ktime_get_coarse_ns(), 1, bytes, &seq)) {
			st->mice++;
			if (!cfg->mice_affine)
				goto pass;
		} else {
			slot = mf_slot(slot, seq, 1, mb, n, &opens);
			s->last_slot = slot;
			if (opens)
				s->batches++;
		}
	} else if (batch > 0) {
		/* Micro-flows: the counter is shared by every CPU that sees the flow, hence atomic. */
		__u64 one = 0, *cnt = bpf_map_lookup_elem(&prg_gs_flows, &f);
		if (!cnt) {
			bpf_map_update_elem(&prg_gs_flows, &f, &one, BPF_NOEXIST);
			cnt = bpf_map_lookup_elem(&prg_gs_flows, &f);
		}
		if (cnt) {
			__u64 seq = __sync_fetch_and_add(cnt, 1);
			slot = (__u32)((slot + seq / batch) % n);
		}
	}
	/* slot < n <= GS_MAX_SLOTS already; the barrier keeps clang from dropping the check the
	 * verifier needs to bound the array index. */
	asm volatile("" : "+r"(slot));
	if (slot >= GS_MAX_SLOTS)
		goto pass;
	__u32 cpu = cfg->cpus[slot];
	struct gs_ring *ring = 0;
	__u32 guard = cfg->ring_guard;
	if (guard) {
		/* A full ring drops at enqueue; rather reorder (another CPU, or the normal path) than
		 * lose a frame. A few tries cover small sets; the last resort is a pass. */
		int ok = 0;
		for (int i = 0; i < 4; i++) {
			if (i > 0) {
				slot = slot + 1 < n ? slot + 1 : 0;
				asm volatile("" : "+r"(slot));
				if (slot >= GS_MAX_SLOTS)
					goto pass;
				cpu = cfg->cpus[slot];
			}
			ring = bpf_map_lookup_elem(&prg_gs_rings, &cpu);
			if (!ring || ring->enq - ring->deq < guard) {
				ok = 1;
				break;
			}
			st->diverted++;
		}
		if (!ok) {
			st->overflow++;
			goto pass;
		}
	}

	/* flags 0: a missing entry returns XDP_ABORTED, which we turn into a pass, never a drop */
	long act = bpf_redirect_map(&prg_gs_cpus, cpu, 0);
	if (act != XDP_REDIRECT) {
		st->missed++;
		goto pass;
	}
	if (ring)
		__sync_fetch_and_add(&ring->enq, 1);
	st->redirected++;
	st->vxlan += vx;
	st->last_hash = h;
	st->last_slot = slot;
	st->last_cpu = cpu;
	if (cpu < GS_MAX_CPUS) {
		st->to_cpu[cpu]++;
		if (opens) {
			st->batches++;
			st->batch_to_cpu[cpu]++;
		}
	}
	return XDP_REDIRECT;
pass:
	st->passed++;
	return XDP_PASS;
}

/*
 * Enqueue drops: when a split CPU's ring (qsize) is full, the cpumap drops the frame before any
 * program sees it again. xdp:xdp_cpumap_enqueue reports them per bulk flush on the enqueuing CPU.
 */
SEC("tp_btf/xdp_cpumap_enqueue")
int BPF_PROG(prg_gs_drops, int map_id, unsigned int processed, unsigned int drops, int to_cpu)
{
	__u32 zero = 0;
	struct gs_cfg *cfg = bpf_map_lookup_elem(&prg_gs_cfg, &zero);
	if (!cfg || drops == 0 || (__u32)map_id != cfg->cpumap_id)
		return 0;
	struct gs_stats *st = bpf_map_lookup_elem(&prg_gs_stats, &zero);
	if (st)
		st->dropped += drops;
	/* Dropped frames never reach the kthread: count them out of the ring guard's occupancy. */
	__u32 cpu = to_cpu;
	struct gs_ring *ring = bpf_map_lookup_elem(&prg_gs_rings, &cpu);
	if (ring)
		__sync_fetch_and_add(&ring->deq, drops);
	return 0;
}

/* Second-level program of the split CPUs' cpumap entries (mflow only): it runs in the cpumap
 * kthread for each frame taken off the ring, before the skb is built, and counts it. */
SEC("xdp.frags/cpumap") /* frags like prg_grosplit: the cpumap accepts only matching programs */
int prg_gs_deq(struct xdp_md *ctx)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct gs_ring *ring = bpf_map_lookup_elem(&prg_gs_rings, &cpu);
	if (ring)
		__sync_fetch_and_add(&ring->deq, 1);
	return XDP_PASS;
}
