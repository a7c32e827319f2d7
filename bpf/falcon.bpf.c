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
 * Keep the arithmetic in step with internal/datapath/falcon/model.go: the tests compare them.
 */
#include "common.h"
#include "rps.h"
#include <bpf/bpf_endian.h>

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
	__u16 vxlan_port[4]; /* UDP destination ports carrying VXLAN (host order), 0 = unused */
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
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
	__u32 salt; /* the stage: same flow, other stage, other entry */
};

struct falcon_choice {
	__u64 last_ns;
	__u32 idx;
	__u32 epoch;
	__u32 kind;
	__u32 pad;
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
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct falcon_flow);
	__type(value, struct falcon_choice);
} prg_falcon_flow SEC(".maps");

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

static __always_inline __u32 flow_hash(const struct falcon_flow *f)
{
	__u32 h = 0x9e3779b9;
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = prg_fmix32(h ^ f->saddr[i]);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = prg_fmix32(h ^ f->daddr[i]);
	h = prg_fmix32(h ^ (((__u32)f->sport << 16) | f->dport));
	return prg_fmix32(h ^ f->proto);
}

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

/* parse_inner fills f from the Ethernet frame at off. Non-IP, short or malformed: -1. */
static __always_inline int parse_inner(struct __sk_buff *ctx, __u32 off, struct falcon_flow *f)
{
	struct ethhdr eth;
	if (bpf_skb_load_bytes(ctx, off, &eth, sizeof(eth)))
		return -1;
	off += sizeof(eth);
	__u16 proto = bpf_ntohs(eth.h_proto);
	__u32 l4 = 0;
	if (proto == 0x0800) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(ctx, off, &ip, sizeof(ip)))
			return -1;
		if (ip.version != 4 || ip.ihl < 5)
			return -1;
		f->saddr[0] = ip.saddr;
		f->daddr[0] = ip.daddr;
		f->proto = ip.protocol;
		/* Fragments: only the first carries ports, so all of them hash on addresses alone. */
		if (ip.frag_off & bpf_htons(0x3fff))
			return 0;
		l4 = off + ip.ihl * 4;
	} else if (proto == 0x86dd) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(ctx, off, &ip6, sizeof(ip6)))
			return -1;
		if (ip6.version != 6)
			return -1;
		__builtin_memcpy(f->saddr, &ip6.saddr, 16);
		__builtin_memcpy(f->daddr, &ip6.daddr, 16);
		f->proto = ip6.nexthdr; /* extension headers: addresses only (ports stay 0) */
		l4 = off + sizeof(ip6);
	} else {
		return -1;
	}
	if (f->proto == IPPROTO_TCP || f->proto == IPPROTO_UDP) {
		__u16 ports[2];
		if (bpf_skb_load_bytes(ctx, l4, ports, sizeof(ports)))
			return -1;
		f->sport = bpf_ntohs(ports[0]);
		f->dport = bpf_ntohs(ports[1]);
	}
	return 0;
}

static __always_inline struct falcon_dev *this_dev(struct __sk_buff *ctx)
{
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
	struct prg_dev_key key = {};
	struct net_device *dev = skb->dev;
	if (!dev)
		return 0;
	prg_dev_key_of(dev, &key);
	return bpf_map_lookup_elem(&prg_falcon_dev, &key);
}

/* steer is Algorithm 1 for one stage transition. */
static __always_inline void steer(struct __sk_buff *ctx, struct falcon_flow *f, __u32 stage)
{
	__u32 zero = 0;
	struct falcon_cfg *cfg = bpf_map_lookup_elem(&prg_falcon_cfg, &zero);
	struct falcon_gate *gate = bpf_map_lookup_elem(&prg_falcon_gate, &zero);
	__u32 fh = flow_hash(f);
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
	__u64 now = bpf_ktime_get_ns();
	__u32 kind, idx;
	struct falcon_choice *c = bpf_map_lookup_elem(&prg_falcon_flow, f);
	if (c && c->epoch == gate->epoch && c->idx < n && now - c->last_ns < cfg->repick_ns) {
		idx = c->idx;
		kind = KIND_STICKY;
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
		struct falcon_choice nc = { .last_ns = now, .idx = idx, .epoch = gate->epoch, .kind = kind };
		bpf_map_update_elem(&prg_falcon_flow, f, &nc, BPF_ANY);
	}
	idx = bound_idx(idx);
	bpf_set_hash(ctx, prg_rps_hash(idx, n, fh));
	record(ctx, kind, stage, idx, cfg->cpus[idx], fh, f->salt);
	count(stage, idx);
	count(stage, SLOT_KIND(kind));
}

static __always_inline int is_vxlan_port(struct falcon_cfg *cfg, __u16 port)
{
#pragma unroll
	for (int i = 0; i < 4; i++)
		if (cfg->vxlan_port[i] && cfg->vxlan_port[i] == port)
			return 1;
	return 0;
}

/* Underlay ingress: outer Ethernet / IPv4 or IPv6 / UDP to a VXLAN port / VXLAN / inner frame. */
SEC("tcx/ingress")
int prg_falcon_nic(struct __sk_buff *ctx)
{
	__u32 zero = 0;
	struct falcon_flow f = {};
	struct falcon_cfg *cfg = bpf_map_lookup_elem(&prg_falcon_cfg, &zero);
	struct falcon_dev *d = this_dev(ctx);
	if (!cfg || !d)
		goto pass;
	struct ethhdr eth;
	if (bpf_skb_load_bytes(ctx, 0, &eth, sizeof(eth)))
		goto pass;
	__u32 off = sizeof(eth), udp_off;
	if (eth.h_proto == bpf_htons(0x0800)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(ctx, off, &ip, sizeof(ip)) || ip.version != 4 || ip.ihl < 5 ||
		    ip.protocol != IPPROTO_UDP || (ip.frag_off & bpf_htons(0x3fff)))
			goto pass;
		udp_off = off + ip.ihl * 4;
	} else if (eth.h_proto == bpf_htons(0x86dd)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(ctx, off, &ip6, sizeof(ip6)) || ip6.version != 6 ||
		    ip6.nexthdr != IPPROTO_UDP)
			goto pass;
		udp_off = off + sizeof(ip6);
	} else {
		goto pass;
	}
	struct udphdr udp;
	if (bpf_skb_load_bytes(ctx, udp_off, &udp, sizeof(udp)) || !is_vxlan_port(cfg, bpf_ntohs(udp.dest)))
		goto pass;
	__u32 vx[2]; /* flags(8) reserved(24) | VNI(24) reserved(8) */
	if (bpf_skb_load_bytes(ctx, udp_off + sizeof(udp), vx, sizeof(vx)) || !(vx[0] & bpf_htonl(0x08000000)))
		goto pass;
	if (parse_inner(ctx, udp_off + sizeof(udp) + sizeof(vx), &f))
		goto pass;
	/* Several VXLAN devices may share one underlay: the VNI tells them apart. */
	f.salt = prg_fmix32(d->salt ^ (bpf_ntohl(vx[1]) >> 8));
	steer(ctx, &f, d->stage);
	return TCX_NEXT;
pass:
	record(ctx, KIND_PASS, d ? d->stage : 0, 0, 0, 0, 0);
	return TCX_NEXT;
}

/* Bridge port egress: the frame is the inner one; the next stage is the veth peer. */
SEC("tcx/egress")
int prg_falcon_port(struct __sk_buff *ctx)
{
	struct falcon_flow f = {};
	struct falcon_dev *d = this_dev(ctx);
	if (!d || parse_inner(ctx, 0, &f)) {
		record(ctx, KIND_PASS, d ? d->stage : 0, 0, 0, 0, 0);
		return TCX_NEXT;
	}
	f.salt = d->salt;
	steer(ctx, &f, d->stage);
	return TCX_NEXT;
}
