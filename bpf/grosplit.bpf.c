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
 * IP fragments hash without ports (ports=0), so every fragment of a datagram stays together.
 * Anything not understood (non-IP, short, truncated, bad header lengths) gets XDP_PASS and stays
 * on the IRQ core untouched. A target CPU without a cpumap entry (the CPU set changing under
 * traffic) also passes: the program never drops a frame.
 *
 * The Go model in internal/datapath/grosplit/model.go must mirror prg_hash_* and the slot math.
 */
#include "common.h"
#include <bpf/bpf_endian.h>

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

/* murmur3's 32-bit finalizer: cheap, and every input bit reaches every output bit. */
static __always_inline __u32 gs_mix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 gs_hash(const struct gs_flow *f)
{
	__u32 h = 0x9e3779b9;
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = gs_mix(h ^ f->src[i]);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = gs_mix(h ^ f->dst[i]);
	h = gs_mix(h ^ f->ports);
	return gs_mix(h ^ f->proto);
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
	if (batch > 0) {
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

	/* flags 0: a missing entry returns XDP_ABORTED, which we turn into a pass, never a drop */
	long act = bpf_redirect_map(&prg_gs_cpus, cpu, 0);
	if (act != XDP_REDIRECT) {
		st->missed++;
		goto pass;
	}
	st->redirected++;
	st->vxlan += vx;
	st->last_hash = h;
	st->last_slot = slot;
	st->last_cpu = cpu;
	if (cpu < GS_MAX_CPUS)
		st->to_cpu[cpu]++;
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
	return 0;
}
