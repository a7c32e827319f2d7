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
 *     the configured set) the *inner* 5-tuple is hashed, so inner flows spread even when the
 *     outer tuple is shared; an inner frame that is not IP (ARP...) falls back to the outer tuple.
 *   - micro-flows (batch == B > 0, MFLOW): a per-flow packet counter; consecutive batches of B
 *     packets rotate round-robin over the slots, starting at the flow's hashed slot. This DOES
 *     reorder across batches by design: stock kernels have no in-order reassembly point.
 *   - MFLOW with elephant detection (cfg.mflow == 1, internal/datapath/mflow): micro-flows as
 *     above, but only for flows whose rate makes them elephants (bpf/mflow.h); a mouse's frames
 *     pass (the normal path) or, with mice_affine, keep flow affinity. Per-flow state lives in
 *     prg_gs_mflows, and the per-target batch counters say how the batches spread.
 * IP fragments hash without ports (ports=0), so every fragment of a datagram stays together.
 * Anything not understood (non-IP, short, truncated, bad header lengths) gets XDP_PASS and stays
 * on the IRQ core untouched. A target CPU without a cpumap entry (the CPU set changing under
 * traffic) also passes: the program never drops a frame.
 *
 * The Go model in internal/datapath/grosplit/model.go must mirror prg_hash_* and the slot math.
 */
#include "common.h"
#include "rps.h"
#include <bpf/bpf_endian.h>
#include "mflow.h"

char LICENSE[] SEC("license") = "GPL";

#define GS_MAX_SLOTS 64  /* CPUs in one split set */
#define GS_MAX_PORTS 8   /* VXLAN UDP destination ports */
#define GS_MAX_CPUS 256  /* CPU ids the per-target counters cover */

#define GS_ETH_P_IP 0x0800
#define GS_ETH_P_IPV6 0x86DD
#define GS_ETH_P_8021Q 0x8100
#define GS_ETH_P_8021AD 0x88A8
#define GS_IPPROTO_TCP 6
#define GS_IPPROTO_UDP 17
#define GS_IPPROTO_SCTP 132
#define GS_VXLAN_HLEN 8

/* Live configuration, one array entry written by Go. Field order is the Go struct's order. */
struct gs_cfg {
	__u32 n_cpus;              /* 0 = split off: every frame passes */
	__u32 batch;               /* 0 = flow affinity; B > 0 = micro-flows of B packets */
	__u32 n_ports;             /* valid entries of vxlan_ports */
	__u32 cpumap_id;           /* kernel id of prg_gs_cpus: the drop tracepoint filters on it */
	__u16 vxlan_ports[GS_MAX_PORTS]; /* host order */
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

/* The flow key the hash covers. Addresses are v4-in-first-word or full v6. */
struct gs_flow {
	__u32 src[4];
	__u32 dst[4];
	__u32 ports; /* sport | dport << 16, as loaded from the packet (network order halves) */
	__u32 proto;
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
	__type(key, struct gs_flow);
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
	__type(key, struct gs_flow);
	__type(value, struct mf_flow_state);
} prg_gs_mflows SEC(".maps");

static __always_inline __u32 gs_hash(const struct gs_flow *f)
{
	__u32 h = 0x9e3779b9;
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = prg_fmix32(h ^ f->src[i]);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = prg_fmix32(h ^ f->dst[i]);
	h = prg_fmix32(h ^ f->ports);
	return prg_fmix32(h ^ f->proto);
}

/* Parse result codes. */
#define GS_OK 0
#define GS_BAD 1 /* short, truncated or malformed: pass */
#define GS_NOTIP 2

/* Skip up to two VLAN tags; *off is advanced past them, the inner ethertype is returned. */
static __always_inline int gs_eth(void *data, void *end, __u32 *off, __u16 *proto)
{
	struct ethhdr *eth = data + *off;
	if ((void *)(eth + 1) > end)
		return GS_BAD;
	__u16 p = bpf_ntohs(eth->h_proto);
	*off += sizeof(*eth);
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (p != GS_ETH_P_8021Q && p != GS_ETH_P_8021AD)
			break;
		struct vlan_hdr *vh = data + *off;
		if ((void *)(vh + 1) > end)
			return GS_BAD;
		p = bpf_ntohs(vh->h_vlan_encapsulated_proto);
		*off += sizeof(*vh);
	}
	*proto = p;
	return GS_OK;
}

/*
 * Fill f from the IP header at *off. On return *off points at the L4 header and *l4ok says the
 * ports are readable there (not a fragment, a port-carrying protocol). Extension headers of IPv6
 * are not walked: such packets hash on addresses + next header, which is still per-flow stable.
 */
static __always_inline int gs_ip(void *data, void *end, __u32 *off, __u16 ethproto,
				 struct gs_flow *f, int *l4ok)
{
	*l4ok = 0;
	if (ethproto == GS_ETH_P_IP) {
		struct iphdr *ip = data + *off;
		if ((void *)(ip + 1) > end)
			return GS_BAD;
		if (ip->version != 4 || ip->ihl < 5)
			return GS_BAD;
		__u32 hl = ip->ihl * 4;
		if (data + *off + hl > end)
			return GS_BAD;
		f->src[0] = ip->saddr;
		f->dst[0] = ip->daddr;
		f->proto = ip->protocol;
		*off += hl;
		/* MF set or a non-zero offset: a fragment, ports absent or not per-datagram stable */
		*l4ok = (ip->frag_off & bpf_htons(0x3fff)) == 0;
		return GS_OK;
	}
	if (ethproto == GS_ETH_P_IPV6) {
		struct ipv6hdr *ip6 = data + *off;
		if ((void *)(ip6 + 1) > end)
			return GS_BAD;
		if (ip6->version != 6)
			return GS_BAD;
		__builtin_memcpy(f->src, &ip6->saddr, 16);
		__builtin_memcpy(f->dst, &ip6->daddr, 16);
		f->proto = ip6->nexthdr;
		*off += sizeof(*ip6);
		*l4ok = 1;
		return GS_OK;
	}
	return GS_NOTIP;
}

static __always_inline int gs_has_ports(__u32 proto)
{
	return proto == GS_IPPROTO_TCP || proto == GS_IPPROTO_UDP || proto == GS_IPPROTO_SCTP;
}

/* Read the two port halves at *off (TCP, UDP and SCTP all start with sport, dport). */
static __always_inline int gs_ports(void *data, void *end, __u32 off, struct gs_flow *f)
{
	__u16 *p = data + off;
	if ((void *)(p + 2) > end)
		return GS_BAD;
	f->ports = (__u32)p[0] | ((__u32)p[1] << 16);
	return GS_OK;
}

static __always_inline int gs_is_vxlan(const struct gs_cfg *cfg, __u16 dport)
{
#pragma unroll
	for (int i = 0; i < GS_MAX_PORTS; i++) {
		if (i >= cfg->n_ports)
			break;
		if (cfg->vxlan_ports[i] == dport)
			return 1;
	}
	return 0;
}

/*
 * Build the flow key of a frame: outer 5-tuple, or inner for VXLAN. Returns GS_OK with *vx set
 * when the inner tuple was used, anything else means "pass it".
 */
static __always_inline int gs_flow_of(void *data, void *end, const struct gs_cfg *cfg,
				      struct gs_flow *f, int *vx)
{
	__u32 off = 0;
	__u16 proto;
	int l4ok, r;

	*vx = 0;
	if ((r = gs_eth(data, end, &off, &proto)) != GS_OK)
		return r;
	if ((r = gs_ip(data, end, &off, proto, f, &l4ok)) != GS_OK)
		return r;
	if (!l4ok || !gs_has_ports(f->proto))
		return GS_OK; /* hash on addresses + protocol */
	if (gs_ports(data, end, off, f) != GS_OK)
		return GS_BAD;
	if (f->proto != GS_IPPROTO_UDP || !gs_is_vxlan(cfg, bpf_ntohs((__u16)(f->ports >> 16))))
		return GS_OK;

	/* VXLAN: UDP header, VXLAN header, then the inner Ethernet frame. */
	off += sizeof(struct udphdr) + GS_VXLAN_HLEN;
	struct gs_flow in = {};
	if ((r = gs_eth(data, end, &off, &proto)) != GS_OK)
		return r;
	r = gs_ip(data, end, &off, proto, &in, &l4ok);
	if (r == GS_NOTIP)
		return GS_OK; /* inner ARP and the like: the outer tuple is a fine per-flow key */
	if (r != GS_OK)
		return r;
	if (l4ok && gs_has_ports(in.proto) && gs_ports(data, end, off, &in) != GS_OK)
		return GS_BAD;
	*f = in;
	*vx = 1;
	return GS_OK;
}

static __always_inline __u32 gs_slot(__u32 hash, __u32 n)
{
	return (__u32)(((__u64)hash * n) >> 32); /* reciprocal_scale, as RPS does */
}

SEC("xdp.frags")
int prg_grosplit(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 zero = 0;

	struct gs_stats *st = bpf_map_lookup_elem(&prg_gs_stats, &zero);
	struct gs_cfg *cfg = bpf_map_lookup_elem(&prg_gs_cfg, &zero);
	if (!st || !cfg)
		return XDP_PASS;
	__u32 n = cfg->n_cpus;
	if (n == 0 || n > GS_MAX_SLOTS)
		goto pass;

	struct gs_flow f = {};
	int vx;
	if (gs_flow_of(data, end, cfg, &f, &vx) != GS_OK)
		goto pass;

	__u32 h = gs_hash(&f);
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
		if (!mf_account(s, &cfg->mf, bpf_ktime_get_ns(), 1, bytes, &seq)) {
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
