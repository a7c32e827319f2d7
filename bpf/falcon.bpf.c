// SPDX-License-Identifier: GPL-2.0
/*
 * FALCON softirq pipelining and two-choice balancing on a stock kernel.
 *
 * FALCON (EuroSys'21) moves each device stage of one flow (underlay NIC, VXLAN, container veth)
 * to its own CPU: at every stage transition (netif_rx) it picks a CPU from a hash of the flow
 * salted with the next device, gated by a load monitor (Algorithm 1). A stock kernel has no hook
 * in netif_rx, but it has RPS at exactly those transitions: the VXLAN device's RPS (after its
 * gro_cells) and the container veth's RPS (at netif_rx). RPS picks
 *     map->cpus[reciprocal_scale(skb->hash, map->len)]
 * with map->cpus the device's rps_cpus mask in ascending CPU order. So a tc program on the device
 * *before* a stage computes FALCON's choice for the next stage and writes a hash with
 * bpf_set_hash that RPS maps to exactly that CPU. The controller sets every steered device's
 * rps_cpus to the FALCON CPU set and its rps_flow_cnt to 0 (RFS would override the hash).
 *
 *   prg_falcon_nic   tcx ingress of the underlay: parses the VXLAN frame, decides the VXLAN stage.
 *                    bpf_set_hash marks the hash L4, and an L4 hash survives decapsulation
 *                    (iptunnel_pull_header clears only non-L4 hashes), so vxlan0's RPS uses it.
 *   prg_falcon_port  tcx egress of a bridge port veth: decides the container veth's stage.
 *
 * Gate closed (average load of the FALCON CPUs at or above the threshold): the hash is set to 0,
 * which get_rps_cpu reads as "no hash" and leaves the packet on the current CPU, i.e. where the
 * vanilla path (no RPS) runs it, whatever that CPU is.
 *
 * Choices are sticky per (flow, stage) in an LRU map: a flow is re-picked only after it was idle
 * for repick_ns (its earlier packets have left every backlog by then) or when the controller
 * bumps the epoch (the gate re-opened): a deliberate re-pick, never a per-packet flip.
 *
 * Cost per packet matters as much as the decision (issue 12: every program <= 150 ns net). So
 * the choices live in a 2-way set-associative table in a plain array (an inlined lookup, no
 * hashing or LRU list work in the kernel), indexed by the flow hash mixed with the stage salt
 * and tagged with both (8 bytes, not the 40-byte 5-tuple); a miss evicts the way used longest
 * ago, as an LRU would. Two flows whose hash and salt both collide share a choice, the one both
 * would compute anyway unless loads changed in between. Entries are written without locks: two
 * CPUs filling one set at once can leave a way torn, which costs at most one packet a re-pick
 * or a placement, never a wrong CPU index (idx < n is checked). The time is the coarse clock (a
 * jiffy is far below repick_ns, 200 ms by default, 1 ms at least), and a sticky hit writes the
 * entry only when that clock moved, so a busy flow dirties its cache line once per tick.
 *
 * Keep the arithmetic in step with internal/datapath/falcon/model.go: the tests compare them.
 */
#include "common.h"
#include "rps.h"
#include "vxlan.h"

char LICENSE[] SEC("license") = "GPL";

#define FALCON_MAX_CPUS 64   /* entries of the CPU set (as the paper's prototype) */
#define FALCON_MAX_CPU_ID 1024
#define FALCON_STAGES 4      /* stat rows; stage ids below */
#define FALCON_SLOTS 72      /* per stage: 0..63 packets steered to set index i, then the kinds */

#define STAGE_VXLAN 0 /* decided at the underlay's ingress */
#define STAGE_VETH 1  /* decided at a bridge port's egress */

enum falcon_kind {
	KIND_PASS = 0,   /* not ours, short, malformed: untouched */
	KIND_GATE = 1,   /* gate closed: hash 0, stays on the current CPU */
	KIND_FIRST = 2,  /* first choice */
	KIND_SECOND = 3, /* first choice busy: re-hash, kept regardless */
	KIND_STICKY = 4, /* reused the flow's earlier choice */
};
#define SLOT_KIND(k) (FALCON_MAX_CPUS + (k))

#define TCX_NEXT (-1)

/* Static settings, written once at attach. */
struct falcon_cfg {
	__u32 n;          /* CPUs in the set, 1..64 */
	__u32 threshold;  /* busy percent at or above which a CPU (or the average) is busy */
	__u32 two_choice; /* 0: "static", first choice only */
	__u16 vxlan_ports[PRG_VXLAN_MAX_PORTS]; /* UDP destination ports carrying VXLAN (vxlan.h) */
	__u64 repick_ns;  /* idle time after which a flow's choice may be re-picked */
	__u32 cpus[FALCON_MAX_CPUS]; /* ascending: the order of the RPS map */
};

/* Written by the agent every monitor interval. */
struct falcon_gate {
	__u32 open;  /* average load of the set below the threshold */
	__u32 epoch; /* bumped when the gate re-opens: choices are re-picked */
	__u32 avg;   /* average load, percent (for status) */
	__u32 pad;
	__u64 updated_ns;
};

/* The device a program runs on -> what it decides. */
struct falcon_dev {
	__u32 salt;  /* namespace-unique salt of the next stage's device */
	__u32 stage; /* STAGE_* */
};

struct falcon_flow {
	__u32 fh;   /* prg_flow_hash of the 5-tuple */
	__u32 salt; /* the stage: same flow, other stage, other entry */
};

struct falcon_choice {
	__u32 fh;   /* tag: the falcon_flow it belongs to */
	__u32 salt;
	__u64 last_ns; /* 0: empty way */
	__u32 idx;
	__u32 epoch;
	__u32 kind;
	__u32 pad;
};

#define FALCON_SETS 32768 /* x 2 ways: 65536 flow-stage choices, 2 MiB */
struct falcon_set {
	struct falcon_choice way[2];
};

/* The last decision on this CPU: tests read it, people may. */
struct falcon_last {
	__u32 kind;
	__u32 stage;
	__u32 idx;
	__u32 cpu;  /* chosen CPU (current CPU when the gate is closed) */
	__u32 hash; /* skb->hash as RPS will read it */
	__u32 flow_hash;
	__u32 salt;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct falcon_cfg);
} prg_falcon_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct falcon_gate);
} prg_falcon_gate SEC(".maps");

/* EWMA busy percent per CPU id, written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FALCON_MAX_CPU_ID);
	__type(key, __u32);
	__type(value, __u32);
} prg_falcon_load SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct prg_dev_key);
	__type(value, struct falcon_dev);
} prg_falcon_dev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FALCON_SETS);
	__type(key, __u32);
	__type(value, struct falcon_set);
} prg_falcon_flow SEC(".maps");

/* Per-CPU cache of prg_falcon_dev (see this_dev). */
#define FALCON_DEVC 8
struct falcon_devc {
	struct prg_dev_key key;
	struct falcon_dev dev;
	__u32 valid;
	__u32 pad;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FALCON_DEVC);
	__type(key, __u32);
	__type(value, struct falcon_devc);
} prg_falcon_devc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FALCON_STAGES * FALCON_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} prg_falcon_stat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct falcon_last);
} prg_falcon_last SEC(".maps");

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* The compiler knows idx < n <= 64 and drops a mask the verifier (which does not track "%")
 * needs; an empty asm hides the value from it. */
#define bound_idx(x) ({ __u32 __v = (x); asm volatile("" : "+r"(__v)); __v & (FALCON_MAX_CPUS - 1); })

/* prg_fmix32 (bpf/rps.h) stands in for FALCON's hash_32(), a multiply whose low bits (all that
 * "% n" reads) are poor; a full avalanche keeps stages independent on small CPU sets. */

static __always_inline void count(__u32 stage, __u32 slot)
{
	__u32 k = (stage & (FALCON_STAGES - 1)) * FALCON_SLOTS + slot;
	__u64 *c = bpf_map_lookup_elem(&prg_falcon_stat, &k);
	if (c)
		*c += 1;
}

static __always_inline void record(struct __sk_buff *ctx, __u32 kind, __u32 stage, __u32 idx,
				   __u32 cpu, __u32 fh, __u32 salt)
{
	__u32 zero = 0;
	struct falcon_last *l = bpf_map_lookup_elem(&prg_falcon_last, &zero);
	if (!l)
		return;
	l->kind = kind;
	l->stage = stage;
	l->idx = idx;
	l->cpu = cpu;
	l->hash = ctx->hash;
	l->flow_hash = fh;
	l->salt = salt;
}

/* this_dev is the device's entry in prg_falcon_dev, through a small per-CPU cache (direct-mapped
 * by ifindex) that saves the hash lookup on almost every packet. An entry only changes when
 * userspace attaches or detaches the device's piece, which also attaches or detaches the program
 * there, so a cached copy never decides for a device the program no longer runs on. */
static __always_inline struct falcon_dev *this_dev(struct __sk_buff *ctx)
{
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
	struct prg_dev_key key = {};
	struct net_device *dev = skb->dev;
	if (!dev)
		return 0;
	prg_dev_key_of(dev, &key);
	__u32 ci = key.ifindex & (FALCON_DEVC - 1);
	struct falcon_devc *c = bpf_map_lookup_elem(&prg_falcon_devc, &ci);
	if (c && c->valid && c->key.ifindex == key.ifindex && c->key.netns == key.netns)
		return &c->dev;
	struct falcon_dev *d = bpf_map_lookup_elem(&prg_falcon_dev, &key);
	if (d && c) {
		c->key = key;
		c->dev = *d;
		c->valid = 1;
	}
	return d;
}

/* steer is Algorithm 1 for one stage transition. */
static __always_inline void steer(struct __sk_buff *ctx, struct falcon_cfg *cfg, struct falcon_flow *f, __u32 stage)
{
	__u32 zero = 0;
	struct falcon_gate *gate = bpf_map_lookup_elem(&prg_falcon_gate, &zero);
	__u32 fh = f->fh;
	if (!cfg || !gate || cfg->n == 0 || cfg->n > FALCON_MAX_CPUS) {
		record(ctx, KIND_PASS, stage, 0, 0, fh, f->salt);
		count(stage, SLOT_KIND(KIND_PASS));
		return;
	}
	__u32 n = cfg->n;
	if (!gate->open) {
		bpf_set_hash(ctx, 0);
		record(ctx, KIND_GATE, stage, 0, bpf_get_smp_processor_id(), fh, f->salt);
		count(stage, SLOT_KIND(KIND_GATE));
		return;
	}
	__u64 now = bpf_ktime_get_coarse_ns();
	__u32 kind, idx;
	__u32 si = prg_fmix32(fh ^ f->salt) & (FALCON_SETS - 1);
	struct falcon_set *set = bpf_map_lookup_elem(&prg_falcon_flow, &si);
	if (!set) {
		record(ctx, KIND_PASS, stage, 0, 0, fh, f->salt);
		count(stage, SLOT_KIND(KIND_PASS));
		return;
	}
	struct falcon_choice *c = &set->way[0];
	if (c->fh != fh || c->salt != f->salt || c->last_ns == 0) {
		c = &set->way[1];
		if (c->fh != fh || c->salt != f->salt || c->last_ns == 0)
			c = 0;
	}
	if (c && c->epoch == gate->epoch && c->idx < n && now - c->last_ns < cfg->repick_ns) {
		idx = c->idx;
		kind = KIND_STICKY;
		if (c->last_ns != now)
			c->last_ns = now;
	} else {
		__u32 h = prg_fmix32(fh + f->salt); /* FALCON: hash_32(skb->hash + ifindex) */
		idx = h % n;
		kind = KIND_FIRST;
		if (cfg->two_choice) {
			__u32 cpu = cfg->cpus[bound_idx(idx)];
			__u32 *load = bpf_map_lookup_elem(&prg_falcon_load, &cpu);
			if (load && *load >= cfg->threshold) {
				idx = prg_fmix32(h) % n; /* second choice, committed even if busy */
				kind = KIND_SECOND;
			}
		}
		/* The flow's own way, else the one used longest ago (an empty way has last_ns 0). */
		if (!c)
			c = set->way[0].last_ns <= set->way[1].last_ns ? &set->way[0] : &set->way[1];
		c->fh = fh;
		c->salt = f->salt;
		c->idx = idx;
		c->epoch = gate->epoch;
		c->kind = kind;
		c->last_ns = now ? now : 1;
	}
	idx = bound_idx(idx);
	bpf_set_hash(ctx, prg_rps_hash(idx, n, fh));
	record(ctx, kind, stage, idx, cfg->cpus[idx], fh, f->salt);
	count(stage, idx);
	count(stage, SLOT_KIND(kind));
}

/* Underlay ingress: outer Ethernet / IPv4 or IPv6 / UDP to a VXLAN port / VXLAN / inner frame. */
SEC("tcx/ingress")
int prg_falcon_nic(struct __sk_buff *ctx)
{
	__u32 zero = 0;
	struct falcon_flow f = {};
	struct prg_hdrs h = {};
	struct prg_vxlan vx;
	struct prg_pkt p;
	int r;
	struct falcon_cfg *cfg = bpf_map_lookup_elem(&prg_falcon_cfg, &zero);
	struct falcon_dev *d = this_dev(ctx);
	if (!cfg || !d)
		goto pass;
	prg_pkt_tc(&p, ctx);
	PRG_TC_PARSE(r, &p, ctx, prg_vxlan_outer(&p, cfg->vxlan_ports, &vx));
	if (r != PRG_OK)
		goto pass;
	PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, vx.inner, 0, &h));
	if (r != PRG_OK)
		goto pass;
	f.fh = prg_flow_hash(&h.flow);
	/* Several VXLAN devices may share one underlay: the VNI tells them apart. */
	f.salt = prg_fmix32(d->salt ^ vx.vni);
	steer(ctx, cfg, &f, d->stage);
	return TCX_NEXT;
pass:
	record(ctx, KIND_PASS, d ? d->stage : 0, 0, 0, 0, 0);
	return TCX_NEXT;
}

/* Bridge port egress: the frame is the inner one; the next stage is the veth peer. */
SEC("tcx/egress")
int prg_falcon_port(struct __sk_buff *ctx)
{
	__u32 zero = 0;
	struct falcon_flow f = {};
	struct prg_hdrs h = {};
	struct prg_pkt p;
	int r = PRG_NO;
	struct falcon_dev *d = this_dev(ctx);
	if (d) {
		prg_pkt_tc(&p, ctx);
		PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, 0, 0, &h));
	}
	if (r != PRG_OK) {
		record(ctx, KIND_PASS, d ? d->stage : 0, 0, 0, 0, 0);
		return TCX_NEXT;
	}
	f.fh = prg_flow_hash(&h.flow);
	f.salt = d->salt;
	steer(ctx, bpf_map_lookup_elem(&prg_falcon_cfg, &zero), &f, d->stage);
	return TCX_NEXT;
}
