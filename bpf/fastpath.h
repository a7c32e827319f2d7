/* SPDX-License-Identifier: GPL-2.0 */
/* fastpath's shared part: counters, config, the flow cache and its maps, the inner-frame parse, flow
 * keys, the hand-over to the normal path and the lookups the programs of fastpath.bpf.c begin with.
 * Included by fastpath.bpf.c only (the maps are defined here). */
#ifndef PRG_FASTPATH_H
#define PRG_FASTPATH_H

#include "common.h"
#include "pod.h"
#include "vxlan.h"
#include <bpf/bpf_endian.h>


#define TCX_NEXT (-1)

/* tcx_next_opaque is TCX_NEXT as a value clang cannot see through. A noinline subprogram whose
 * every return is the same constant (the learners) gets that constant folded into its caller
 * (interprocedural constant propagation) and leaves r0 undefined at its exit; the verifier then
 * refuses the program whenever r0 happens to hold a stack pointer ("cannot return stack pointer
 * to the caller"). Such subprograms return this instead. */
static __always_inline int tcx_next_opaque(void)
{
	int r = TCX_NEXT;

	barrier_var(r);
	return r;
}
#define TC_ACT_SHOT 2
#define FP_IPPROTO_ICMP 1
#define FP_ENCAP_LEN 50 /* outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14 */
/* uapi's BPF_F_ADJ_ROOM_ENCAP_L2(len): a macro, so vmlinux.h lacks it. */
#define FP_ADJ_ROOM_ENCAP_L2(len) (((__u64)(len) & 0xff) << 56)
#define FP_TMPL_LEN 64  /* outer Ethernet 14 + FP_ENCAP_LEN */
/* The flow table's compiled-in size; attach sizes it from the node's memory (flowsize.go). */
#define FP_MAX_FLOWS 65536
/* Flow lifetimes, enforced in the kernel by one timer that sweeps the table once a second
 * (prg_fastpath_sweep, sweep_one), so the agent never walks it: a flow learned both ways lives FP_IDLE_NS past its last learning (an active flow re-learns
 * every FP_REVALIDATE_NS); one the normal path never carried both ways (a flood to ports
 * nobody answers, a connection refused) FP_PENDING_NS past its last handover; a TCP connection
 * that sent FIN or RST FP_CLOSE_NS past it. */
#define FP_IDLE_NS (60ULL * 1000000000ULL)
#define FP_PENDING_NS (10ULL * 1000000000ULL)
#define FP_CLOSE_NS (2ULL * 1000000000ULL)
/* Per-pod flow counters (prg_fastpath_pcnt): pods, and the other local addresses flows are
 * keyed by. */
#define FP_MAX_PCNT 16384
/* The largest IPv4 packet whose tot_len holds its length. BIG TCP (option big_tcp) builds larger
 * GSO packets and sets their tot_len to 0 (the kernel's iph_set_totlen): egress reads them with
 * parse_big and encapsulates them with an outer tot_len 0 too; ingress leaves such frames to the
 * normal path (FP_R_BIG). */
#define FP_IP_MAX 65535
#define FP_MAX_PODS 4096
/* Overlays one attachment serves (docker swarm: ingress plus each user overlay). */
#define FP_MAX_OVL 16
/* Each direction of a flow takes the normal path once per this long (re-learned there). */
#define FP_REVALIDATE_NS (5ULL * 1000000000ULL)
/* skb->mark of frames prg_fastpath_tx/dtx redirected, so the learner behind them skips them and
 * gives the mark back (a pod's packet arrives at its host-side veth with mark 0: crossing the
 * namespace scrubbed it). */
#define FP_MARK 0x0fa57000

/* cfg.flags */
#define FP_C_ON 1      /* configured */
#define FP_C_DOCKER 2  /* docker layout (dtx/drx); else flannel layout (tx/rx) */
#define FP_C_ROUTED 4  /* the VXLAN device has no bridge: decapsulated frames are IP-forwarded */
#define FP_C_UNSUP 8   /* the device does something the fast path does not reproduce (TOS/DF inherit, ...) */
#define FP_C_ONEWAY 16 /* opt-in: ingress needs only the ingress direction learned (see begin_in) */

/* flow.flags */
#define FP_F_OUT 1   /* the normal path carried the flow out of the pod (template learned) */
#define FP_F_IN 2    /* the normal path delivered the flow to the pod */
#define FP_F_DNAT 4  /* the normal path translated the flow's destination to nat_addr:nat_port
		      * (a Service): egress replays it, ingress the reverse on the replies */
#define FP_F_ALIAS 8 /* not a flow: the translated view of flow (local, nat_addr, lport, nat_port) */
#define FP_F_NATX 16 /* the normal path translates the flow in a way the fast path does not
		      * reproduce (source NAT, a changed protocol): it stays there */
#define FP_F_LOCAL 32 /* same node: egress delivers to a local pod (fastpath_local.h) */
#define FP_F_SNAT 64  /* same node: egress rewrites the source to nat_addr:nat_port (a Service
		       * backend's reply, as conntrack reverses the DNAT) */
#define FP_F_CLOSING 128 /* TCP FIN or RST seen (seen_ns): the entry goes FP_CLOSE_NS later */
#define FP_F_COUNTED 256 /* counted in prg_fastpath_pcnt under its local address */
#define FP_F_FIN_OUT 512  /* TCP: the local pod sent its FIN (either end's RST sets both) */
#define FP_F_FIN_IN 1024  /* TCP: the remote end sent its FIN */
/* Both FINs went through conntrack: no data can follow, only their ACKs (the agent's liberal
 * marking skips such a connection, ctliberal.go: a short connection costs it nothing). */
#define FP_F_DONE (FP_F_FIN_OUT | FP_F_FIN_IN)
/* TCP: each direction was last learned from a SYN (SYN-ACK): conntrack has seen only the
 * handshake of this connection, its entry waits in SYN_RECV (60 s), and a FIN or RST sent down
 * the normal path would carry sequence and ack numbers beyond the window conntrack knows: INVALID,
 * dropped by kube-proxy's KUBE-FORWARD rule, unless the agent marked the entry liberal first
 * (ctliberal.go; within 1 s). So the FIN and RST of such a connection (a short one) ride the fast
 * path, like the data before them; the entry then expires as a half-open one would, sooner than
 * the TIME_WAIT entry of a connection closed on the normal path (120 s). A flow re-learned from
 * a data packet (every 5 s) loses the flag: conntrack tracks it, and its FIN goes the normal
 * path as before. (Measured on the k8s lab: every crr connection stalled 1.66 s without it.) */
#define FP_F_HSONLY 2048
/* IPv6: the egress direction was learned over the IPv6 underlay (flannel-v6.1): the template's
 * first 14 bytes are the inner Ethernet header the kernel gave the flow, and tx6 hands the inner
 * frame to the VXLAN device (fastpath_u6.h's tx_u6) instead of encapsulating it itself. */
#define FP_F_U6 4096

/* skb->tc_index of a frame handover_out gave the normal path, so the egress learner knows the
 * per-CPU handover record (prg_fastpath_ho) is this frame's (see prg_fastpath_lrn_tx). */
#define FP_TC_INDEX_OUT 0xfa58
/* skb->tc_index of a frame handed to the normal path whose flow has no entry (its local address
 * holds its budget of flows, or the table is full), or whose direction was learned moments ago
 * (dir_fresh: a one-way flow): nothing can be learned from it, so the
 * learners at the end of the normal path give the field back and look nothing up. A flow over its
 * budget then costs one flow-table lookup per node and direction (the tx or rx program's), not
 * three (the learners' misses: prg_fastpath_lrn_tx's and learn_dnat's, local_learn's and
 * prg_fastpath_lrn_rx's). NOOUT: handover_out's (the key_out flow of the frame has no entry);
 * NOIN: handover_in's (its key_in flow has none; the frame came from the underlay, so no local
 * pod sent it either). */
#define FP_TC_INDEX_NOOUT 0xfa5b
#define FP_TC_INDEX_NOIN 0xfa5c
/* 0xfa5d: FP_TC_INDEX_U6 (fastpath_u6.h). Taken elsewhere: 0xfa57 PRG_TC_INDEX_LEARN (common.h),
 * 0xfa59 prism_gate.h, 0xfa5a ezpath_host.bpf.c. */

/* Counters: prg_fastpath_stat[(fp_ovl * 2 + dir) * FP_R_N + reason], dir 0 = egress (from pods), 1 = ingress
 * (reasons from FP_R_N on: prg_fastpath_stat2 and prg_fastpath_stat3, below).
 * Keep in step with the names in internal/datapath/fastpath/view.go. */
enum {
	FP_R_HIT,    /* took the fast path */
	FP_R_MISS,   /* flow not (yet) learned both ways: normal path */
	FP_R_STALE,  /* due for re-learning, or the cache no longer matches the pod/VTEP: normal path */
	FP_R_NOTIP,  /* not IPv4 (ARP, IPv6, ...): normal path */
	FP_R_L2,     /* broadcast/multicast, or not the MAC the normal path accepts: normal path */
	FP_R_OPTS,   /* IPv4 options (inner or outer): normal path */
	FP_R_FRAG,   /* a fragment (inner or outer): normal path */
	FP_R_PROTO,  /* not TCP/UDP/ICMP echo, or a TCP SYN/FIN/RST: normal path */
	FP_R_NOPOD,  /* ingress: inner destination is not a live local pod (the node itself, ...) */
	FP_R_MTU,    /* would exceed the underlay MTU once encapsulated: normal path */
	FP_R_TTL,    /* TTL would expire on the routed hop: normal path (it sends the ICMP error) */
	FP_R_UNSUP,  /* outer UDP checksum on, TOS/DF inherit, a foreign skb mark: normal path */
	FP_R_ERR,    /* a helper failed before anything changed: normal path */
	FP_R_DROP,   /* a helper failed after the packet changed: dropped */
	FP_R_LEARN,  /* learners: a direction learned from the normal path */
	FP_R_OTHER,  /* ingress: not VXLAN to this VTEP/VNI (not overlay traffic): untouched */
	FP_R_NAT,    /* NAT the fast path does not reproduce (source NAT, ...): normal path */
	FP_R_BIG,    /* above 64 KiB and not a BIG TCP packet the fast path reads (egress), or any
		      * frame above 64 KiB (ingress): normal path */
	FP_R_LOCAL,  /* egress: of the hits, those delivered to a pod on this node (also counted as hit) */
	FP_R_BUDGET, /* a new flow of a local address holding its budget of flows: normal path */
	FP_R_FULL,   /* a new flow while the flow table is full: normal path */
	FP_R_CLOSED_LOST, /* a connection closed on the fast path whose record did not fit the
			   * agent's ring (fastpath_closed.h): its conntrack entry stays (60 s) */
	FP_R_N,
	/* Reasons added after prg_fastpath_stat's size was pinned by attachments in the field: an
	 * upgrade in place keeps that map, so these count in prg_fastpath_stat2 (a later map,
	 * repair.go), at (fp_ovl * 2 + dir) * FP_R2_N + (reason - FP_R_N). */
	FP_R_CLOSED_CT = FP_R_N, /* a connection closed on the fast path whose conntrack entry the
				  * program expired itself (fastpath_closed.h): nothing handed to the agent */
	FP_R_N2,
	/* prg_fastpath_stat2's size was pinned in the field too (one reason): the reasons from
	 * FP_R_N2 on count in prg_fastpath_stat3, at (fp_ovl * 2 + dir) * FP_R3_CAP + (reason -
	 * FP_R_N2), whose room (FP_R3_CAP) takes later reasons without another map. */
	FP_R_FORGED = FP_R_N2, /* egress: the source is another live local pod's address (src_refused): normal
		      * path, its flow untouched */
	FP_R_NOSRC,  /* egress: the source is no live local pod's (not listed yet, gone, another
		      * node's, nobody's) and the frame would change or make a flow: normal path */
	FP_R_ALL,
};
#define FP_R2_N (FP_R_N2 - FP_R_N)
#define FP_R3_CAP 16
_Static_assert(FP_R_ALL - FP_R_N2 <= FP_R3_CAP, "prg_fastpath_stat3 is full: FP_R3_CAP is pinned in the field");
#define FP_DIR_TX 0
#define FP_DIR_RX 1

struct fp_cfg {
	__u32 flags;      /* FP_C_* */
	__u32 underlay;   /* flannel: the underlay's ifindex */
	__u32 vx_ifindex; /* docker: the VXLAN device's ifindex (overlay namespace) */
	__u32 vtep;       /* local VTEP IPv4, network order */
	__u32 vni;        /* host order */
	__u32 mtu;        /* underlay MTU */
	__u32 netns;      /* pod endpoint domain: inode of the bridge-side veths' namespace */
	__u16 vxlan_ports[PRG_VXLAN_MAX_PORTS]; /* the device's UDP port (host order; vxlan.h's set) */
	__u16 port_min;   /* UDP source port range [min, max), host order, as udp_flow_src_port */
	__u16 port_max;
	__u8 vx_mac[6];   /* the VXLAN device's MAC (a routed device only accepts frames to it) */
	__u16 pad;
	__u32 gen;        /* flows of another generation are not learned: the agent forgets every
			   * flow of the overlay at once by changing it (no walk of the table) */
	__u32 budget;     /* flows one local address may hold (0: no limit); a new flow beyond it
			   * stays on the normal path, counted "budget" */
};

struct fp_key {
	__u32 local;  /* the local pod's IPv4 (network order) */
	__u32 remote; /* the remote end's IPv4 */
	__u16 lport;  /* network order; ICMP echo: the identifier in both */
	__u16 rport;
	__u8 proto;
	__u8 ovl;     /* fp_ovl of the programs that made it: overlays may reuse addresses */
	__u8 pad[2];
};

struct fp_flow {
	__u8 tmpl[FP_TMPL_LEN]; /* egress: what the kernel put before the inner IP header */
	__u8 in_mac[12];        /* ingress: dst+src MAC the normal path delivered the flow with */
	__u32 vtep;             /* the remote VTEP (flannel); ingress checks the outer source */
	__u32 out_ifindex;      /* the veth the flow leaves the pod on */
	__u32 in_ifindex;       /* the veth the normal path delivered it to */
	__u64 out_ns;           /* when each direction was last learned (bpf_ktime_get_coarse_ns) */
	__u64 in_ns;
	__u32 flags;            /* FP_F_* */
	__u8 out_ttl_seen;      /* TTL the fast path saw on its last handover to the normal path */
	__u8 in_ttl_seen;
	__u8 out_ttl_dec;       /* TTL change of the normal path, per direction */
	__u8 in_ttl_dec;
	__u32 nat_addr;         /* FP_F_DNAT: the backend; FP_F_ALIAS: the Service address */
	__u16 nat_port;         /* network order, as nat_addr */
	__u16 pad;
	__u32 loc_ifindex;      /* FP_F_LOCAL: the receiving pod's host-side veth */
	__u32 gen;              /* cfg.gen when made or last reset (see lookup) */
	__u64 seen_ns;          /* last handover to the normal path, or FIN/RST (FP_F_CLOSING) */
};

/* Which overlay this copy of the programs serves: its config (prg_fastpath_cfg[fp_ovl]), its
 * counters and its flows' keys. Userspace loads one copy of the programs per overlay, sharing the
 * maps, and sets this at load time; the verifier sees a constant, so the hit path looks up its
 * config as before (an inlined array access) and a node can fast-path several overlays, each
 * device and pod veth running the copy of its own overlay. */
volatile const __u32 fp_ovl = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_MAX_OVL);
	__type(key, __u32);
	__type(value, struct fp_cfg);
} prg_fastpath_cfg SEC(".maps");

/* A plain (preallocated) hash, not an LRU: an LRU lets one pod's new flows evict another's.
 * Entries go by the sweep (sweep_one), and each local address holds at most its budget
 * (cfg.budget), so a pod flooding new flows fills only its own share. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_FLOWS);
	__type(key, struct fp_key);
	__type(value, struct fp_flow);
} prg_fastpath_flow SEC(".maps");

/* Flows per local address (key: pcnt_key), for the budget and for status (its sum is the number
 * of flows, read without walking the flow table). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_PCNT);
	__type(key, __u64);
	__type(value, __u32);
} prg_fastpath_pcnt SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_MAX_OVL * 2 * FP_R_N);
	__type(key, __u32);
	__type(value, __u64);
} prg_fastpath_stat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_MAX_OVL * 2 * FP_R2_N);
	__type(key, __u32);
	__type(value, __u64);
} prg_fastpath_stat2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_MAX_OVL * 2 * FP_R3_CAP);
	__type(key, __u32);
	__type(value, __u64);
} prg_fastpath_stat3 SEC(".maps");

PRG_POD_MAPS(prg_fastpath_ep, prg_fastpath_port, FP_MAX_PODS);

static __always_inline void count(__u32 dir, __u32 r)
{
	__u64 *c;

	if (r < FP_R_N) { /* r is a constant at every call: one branch is left */
		__u32 i = (fp_ovl * 2 + dir) * FP_R_N + r;
		c = bpf_map_lookup_elem(&prg_fastpath_stat, &i);
	} else if (r < FP_R_N2) {
		__u32 i = (fp_ovl * 2 + dir) * FP_R2_N + (r - FP_R_N);
		c = bpf_map_lookup_elem(&prg_fastpath_stat2, &i);
	} else {
		__u32 i = (fp_ovl * 2 + dir) * FP_R3_CAP + (r - FP_R_N2);
		c = bpf_map_lookup_elem(&prg_fastpath_stat3, &i);
	}
	if (c)
		*c += 1;
}

static __always_inline struct fp_cfg *fp_config(void)
{
	__u32 ovl = fp_ovl;
	struct fp_cfg *c = bpf_map_lookup_elem(&prg_fastpath_cfg, &ovl);
	return c && (c->flags & FP_C_ON) ? c : NULL;
}

static __always_inline __u64 pcnt_key(const struct fp_key *k)
{
	return ((__u64)k->ovl << 32) | k->local;
}

static __always_inline __u64 max3(__u64 a, __u64 b, __u64 c)
{
	__u64 m = a > b ? a : b;
	return m > c ? m : c;
}

/* sweep_entry deletes entry f of either family's table (map, key k) once its lifetime (see
 * FP_IDLE_NS) has passed since its last activity, counting it down in its address's counter pk. */
static __always_inline long sweep_entry(void *map, void *k, struct fp_flow *f, __u64 now, __u64 pk)
{
	__u64 last, life;

	if (f->flags & FP_F_CLOSING) {
		last = f->seen_ns;
		life = FP_CLOSE_NS;
	} else {
		last = max3(f->out_ns, f->in_ns, f->seen_ns);
		life = (f->flags & (FP_F_OUT | FP_F_IN)) == (FP_F_OUT | FP_F_IN) || (f->flags & FP_F_ALIAS) ? FP_IDLE_NS
													   : FP_PENDING_NS;
	}
	if (now < last + life)
		return 0;
	__u32 counted = f->flags & FP_F_COUNTED;
	if (bpf_map_delete_elem(map, k))
		return 0; /* the next sweep */
	if (counted) {
		__u32 *n = bpf_map_lookup_elem(&prg_fastpath_pcnt, &pk);
		if (n && *n)
			__sync_fetch_and_sub(n, 1);
	}
	return 0;
}

/* sweep_one is sweep_entry for the IPv4 table (bpf_for_each_map_elem's callback). */
static long sweep_one(struct bpf_map *map, struct fp_key *k, struct fp_flow *f, __u64 *now)
{
	return sweep_entry(map, k, f, *now, pcnt_key(k));
}

/* The sweep's timer. One timer, not one per entry: a timer per entry costs an allocation per
 * new flow, and under a burst of short connections those allocations fail (bpf_timer_init:
 * -ENOMEM on 164 of 300 recycled entries in a test), leaving entries that never expire. */
struct fp_sweep {
	struct bpf_timer t;
	__u32 armed;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_sweep);
} prg_fastpath_sweep SEC(".maps");

#define FP_SWEEP_NS (1000ULL * 1000000ULL)

static int sweep(void *map, __u32 *key, struct fp_sweep *s)
{
	__u64 now = bpf_ktime_get_ns();
	bpf_for_each_map_elem(&prg_fastpath_flow, sweep_one, &now, 0);
	bpf_timer_start(&s->t, FP_SWEEP_NS, 0);
	return 0;
}

/* sweep_arm_at starts a table's sweep (its timer map, its callback) with the table's first flow
 * (a failed start is retried with the next). Inlined: timers and cb are constants to the verifier. */
static __always_inline void sweep_arm_at(void *timers, void *cb)
{
	__u32 zero = 0;
	struct fp_sweep *s = bpf_map_lookup_elem(timers, &zero);
	if (!s || s->armed)
		return;
	long r = bpf_timer_init(&s->t, timers, 1 /* CLOCK_MONOTONIC */);
	if (r && r != -16 /* EBUSY: another CPU's */)
		return;
	if (!r && (bpf_timer_set_callback(&s->t, cb) || bpf_timer_start(&s->t, FP_SWEEP_NS, 0)))
		return;
	s->armed = 1;
}

static __always_inline void sweep_arm(void)
{
	sweep_arm_at(&prg_fastpath_sweep, sweep);
}

/* flow_insert adds entry nf under key k to a flow table (map) of either family, within the
 * budget of k's local address (counter key pk); *fresh says it inserted one (the caller arms that
 * table's sweep). NULL (counted under dir: budget, full) when it cannot. */
static __always_inline struct fp_flow *flow_insert(void *map, const struct fp_cfg *cfg, void *k, __u64 pk,
						   struct fp_flow *nf, __u32 dir, int *fresh)
{
	*fresh = 0;
	__u32 *n = bpf_map_lookup_elem(&prg_fastpath_pcnt, &pk);
	if (!n) {
		__u32 zero = 0;
		bpf_map_update_elem(&prg_fastpath_pcnt, &pk, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&prg_fastpath_pcnt, &pk);
		if (!n) {
			count(dir, FP_R_FULL);
			return NULL;
		}
	}
	if (cfg->budget && *n >= cfg->budget) {
		count(dir, FP_R_BUDGET);
		return NULL;
	}
	__sync_fetch_and_add(n, 1);
	nf->gen = cfg->gen;
	nf->seen_ns = bpf_ktime_get_ns();
	nf->flags |= FP_F_COUNTED;
	long err = bpf_map_update_elem(map, k, nf, BPF_NOEXIST);
	struct fp_flow *f = bpf_map_lookup_elem(map, k);
	if (err) {
		__sync_fetch_and_sub(n, 1);
		if (!f) /* not a race with another CPU's insert: the table is full */
			count(dir, FP_R_FULL);
		return f;
	}
	*fresh = 1;
	return f;
}

/* flow_new is flow_insert for the IPv4 table. */
static __always_inline struct fp_flow *flow_new(const struct fp_cfg *cfg, struct fp_key *k, struct fp_flow *nf, __u32 dir)
{
	int fresh;
	struct fp_flow *f = flow_insert(&prg_fastpath_flow, cfg, k, pcnt_key(k), nf, dir, &fresh);
	if (fresh)
		sweep_arm();
	return f;
}

/* flow_reset makes an entry of an older generation (the agent forgot the overlay's flows) a
 * fresh one: nothing learned. Aliases carry no generation (their flow does). */
static __always_inline void flow_reset(struct fp_flow *f, __u32 gen)
{
	if (f->gen == gen || (f->flags & FP_F_ALIAS))
		return;
	f->flags &= FP_F_COUNTED;
	f->out_ns = 0;
	f->in_ns = 0;
	f->out_ttl_seen = 0;
	f->in_ttl_seen = 0;
	f->gen = gen;
}

/* The inner packet, as far as the caches look at it. */
struct fp_pkt {
	struct ethhdr eth;
	__u32 saddr, daddr;
	__u16 sport, dport; /* network order */
	__u8 proto, ttl, tos;
	__u8 hdrs; /* IPv4 + L4 header bytes (for the MTU check of GSO segments) */
	__u8 ctl;  /* TCP: the SYN/FIN/RST bits (FP_TCP_*) */
};

#define FP_TCP_FIN 1
#define FP_TCP_SYN 2
#define FP_TCP_RST 4

/* parse_at reads the inner Ethernet/IPv4/L4 headers at off with the shared parser (parse.h)
 * and adds what the fast path needs beyond it. 0, or the FP_R_* reason the packet stays on the
 * normal path. */
static __always_inline int parse_at(const struct prg_pkt *pk, __u32 off, struct fp_pkt *p)
{
	struct prg_hdrs h = {};
	int r = prg_parse_frame(pk, off, 0, &h);
	if (r == PRG_SHORT)
		return PRG_SHORT;
	if (r != PRG_OK || h.family != 4)
		return FP_R_NOTIP; /* ARP, IPv6, VLAN-tagged, malformed */
	struct ethhdr *eth = prg_hdr(pk, off, struct ethhdr);
	struct iphdr *ip = prg_hdr(pk, h.l3_off, struct iphdr);
	if (!eth || !ip)
		return PRG_SHORT;
	__builtin_memcpy(&p->eth, eth, sizeof(p->eth));
	if (p->eth.h_dest[0] & 1)
		return FP_R_L2;
	if (ip->ihl != 5)
		return FP_R_OPTS;
	if (h.frag)
		return FP_R_FRAG;
	p->saddr = h.flow.saddr[0];
	p->daddr = h.flow.daddr[0];
	p->proto = h.flow.proto;
	p->ctl = 0;
	p->ttl = h.ttl;
	p->tos = ip->tos;
	p->sport = h.flow.sport;
	p->dport = h.flow.dport;
	if (p->proto == PRG_IPPROTO_TCP) {
		__u8 *t = prg_at(pk, h.l4_off, 14); /* ports, seq, ack, data offset, flags */
		if (!t)
			return PRG_SHORT;
		/* FIN, SYN, RST: conntrack must see them; the callers keep them on the normal
		 * path (a SYN is learned from there). */
		p->ctl = t[13] & 0x07;
		p->hdrs = sizeof(*ip) + (t[12] >> 4) * 4;
		return 0;
	}
	if (p->proto == PRG_IPPROTO_UDP) {
		p->hdrs = sizeof(*ip) + 8;
		return 0;
	}
	if (p->proto == FP_IPPROTO_ICMP) {
		__u8 *c = prg_at(pk, h.l4_off, 6); /* type, code, checksum, identifier */
		if (!c)
			return PRG_SHORT;
		if ((c[0] != 0 && c[0] != 8) || c[1] != 0)
			return FP_R_PROTO; /* only echo: errors carry other flows' headers */
		__builtin_memcpy(&p->sport, c + 4, 2);
		p->dport = p->sport; /* symmetric: request and reply share the key */
		p->hdrs = sizeof(*ip) + 8;
		return 0;
	}
	return FP_R_PROTO;
}

/* parse is parse_at on a tc packet, pulling the headers into the linear part once if needed. */
static __always_inline int parse(struct __sk_buff *ctx, __u32 off, struct fp_pkt *p)
{
	struct prg_pkt pk;
	int r;

	prg_pkt_tc(&pk, ctx);
	PRG_TC_PARSE(r, &pk, ctx, parse_at(&pk, off, p));
	return r == PRG_SHORT ? FP_R_NOTIP : r;
}

/* parse_big reads a BIG TCP packet leaving a pod: a TCP GSO packet above 64 KiB whose IPv4
 * tot_len is 0, as the kernel's iph_set_totlen writes it (the shared parser refuses tot_len 0, as
 * it must for a packet that is not GSO). Ethernet, an option-less IPv4 header and TCP, all in the
 * linear part (where the pod's TCP puts them); anything else: FP_R_BIG, the normal path's. */
static __always_inline int parse_big(struct __sk_buff *ctx, struct fp_pkt *p)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	__u8 *t = (void *)(ip + 1);

	if (ctx->len <= FP_IP_MAX + sizeof(struct ethhdr) || !ctx->gso_size || (void *)(t + 14) > end)
		return FP_R_BIG;
	if (eth->h_proto != bpf_htons(PRG_ETH_P_IP) || ip->version != 4 || ip->ihl != 5 || ip->tot_len ||
	    ip->protocol != PRG_IPPROTO_TCP || (ip->frag_off & bpf_htons(0x3fff)))
		return FP_R_BIG;
	__builtin_memcpy(&p->eth, eth, sizeof(p->eth));
	if (p->eth.h_dest[0] & 1)
		return FP_R_L2;
	p->ctl = t[13] & 0x07;
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->proto = PRG_IPPROTO_TCP;
	p->ttl = ip->ttl;
	p->tos = ip->tos;
	__builtin_memcpy(&p->sport, t, 2);
	__builtin_memcpy(&p->dport, t + 2, 2);
	p->hdrs = sizeof(*ip) + (t[12] >> 4) * 4;
	return 0;
}

static __always_inline void key_out(struct fp_key *k, const struct fp_pkt *p)
{
	k->local = p->saddr;
	k->remote = p->daddr;
	k->lport = p->sport;
	k->rport = p->dport;
	k->proto = p->proto;
	k->ovl = fp_ovl;
}

static __always_inline void key_in(struct fp_key *k, const struct fp_pkt *p)
{
	k->local = p->daddr;
	k->remote = p->saddr;
	k->lport = p->dport;
	k->rport = p->sport;
	k->proto = p->proto;
	k->ovl = fp_ovl;
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

#include "fastpath_nat.h"
#include "fastpath_learned.h"

/* ttl_learned is the TTL/hop limit change the normal path made to a learned direction: what the
 * fast path recorded at its handover (*seen: out_ttl_seen or in_ttl_seen) less the delivered
 * frame's ttl, written to *dec, and *seen cleared. *seen is read once, here, not again after
 * the caller's check: two frames of one flow are learned on two CPUs at once (a TCP stream's
 * segments; a receiver's veth egress runs in each sender's context), and the other learner
 * clears the field between this one's check and its use. Re-read, 0 - 63 wrapped to 193, and
 * every later packet of the direction went to the normal path as "ttl" until its 5-s
 * revalidation (TestSameNodeServiceIPv6 in CI: 19 % of a stream). A value below ttl here means
 * the other learner finished the same learning: its change stands. */
static __always_inline void ttl_learned(__u8 *seen, __u8 *dec, __u8 ttl)
{
	__u8 s = *(volatile __u8 *)seen;
	if (s && s >= ttl)
		*dec = s - ttl;
	asm volatile("" ::: "memory"); /* the change before the clear another learner may read */
	*seen = 0;
}

/* seen_out records in flow f, of either family, that the fast path hands its egress packet
 * (ttl, leaving the pod on ifindex) to the normal path, which the learner then learns from. */
static __always_inline void seen_out(struct fp_flow *f, __u32 gen, __u8 ttl, __u32 ifindex)
{
	flow_reset(f, gen);
	f->out_ttl_seen = ttl;
	f->seen_ns = bpf_ktime_get_ns();
	/* The flow now leaves a pod through another veth (a replaced pod with the same
	 * address): the egress direction was learned on the old one, so it is no longer
	 * learned until the normal path carries the flow from this veth. */
	if (f->out_ifindex != ifindex) {
		f->out_ifindex = ifindex;
		__sync_fetch_and_and(&f->flags, ~FP_F_OUT);
	}
}

/* seen_in is seen_out for the ingress direction. */
static __always_inline void seen_in(struct fp_flow *f, __u32 gen, __u8 ttl)
{
	flow_reset(f, gen);
	f->in_ttl_seen = ttl;
	f->seen_ns = bpf_ktime_get_ns();
}

/* dir_fresh: flow f (either family) has direction out (or in) learned within FP_REVALIDATE_NS in
 * generation gen, from the veth ifindex (egress; 0: ingress). A packet of such a flow that misses
 * only because the other direction is not learned (a flow one way, nobody answering: it will never
 * be learned) has nothing to teach the learner: handover skips it (FP_TC_INDEX_NOOUT/NOIN) and
 * the flow costs one lookup per packet, where the learner would re-learn the direction from every
 * packet. The direction is re-learned once it is FP_REVALIDATE_NS old, as a learned flow's is.
 * Same-node flows (FP_F_LOCAL) are left as they were (their learner also learns the receiving
 * pod's direction, local_learn), and so are TCP flows learned from their handshake only
 * (FP_F_HSONLY): a data packet down the normal path must clear that flag. */
static __always_inline int dir_fresh(const struct fp_flow *f, int out, __u32 gen, __u32 ifindex)
{
	__u32 bit = out ? FP_F_OUT : FP_F_IN;
	if (!(f->flags & bit) || (f->flags & (FP_F_ALIAS | FP_F_NATX | FP_F_LOCAL | FP_F_HSONLY)) || f->gen != gen)
		return 0;
	if (out && f->out_ifindex != ifindex)
		return 0;
	return bpf_ktime_get_coarse_ns() - (out ? f->out_ns : f->in_ns) <= FP_REVALIDATE_NS;
}

/* Forged sources. A pod's frame may carry any source address: one with another pod's (a
 * neighbour's) would, through seen_out, move that pod's learned flow to the forger's veth and
 * un-learn it, and through flow_new make entries charged to that pod's budget; one with nobody's
 * address would make entries under budgets of their own until the table is full. So before an
 * egress program changes a flow (seen_out, closing, syn_open, local_syn) or makes one, the
 * frame's source must be the live endpoint (pod.h) on the veth it came from: src_refused says
 * FP_R_FORGED (another live pod's address) or FP_R_NOSRC (no live endpoint: not listed yet, gone,
 * not a pod of this node), 0 when it is. A flow learned on this veth (out_ifindex) proves it
 * already: only the mismatch and the new flow look the endpoint up, never a hit. The refused
 * frame goes to the normal path (rp_filter and the CNI decide) tagged FP_TC_INDEX_NOOUT: the
 * learners learn nothing from it. */
static __always_inline __u32 src_owner(__u32 ifindex, int r, const struct prg_pod *pod)
{
	if (r != PRG_POD_OK || !pod)
		return FP_R_NOSRC;
	return pod->ifindex == ifindex ? 0 : FP_R_FORGED;
}

static __always_inline __u32 src_refused(struct __sk_buff *ctx, const struct fp_cfg *cfg, const struct fp_flow *f,
					 __u32 saddr)
{
	__u32 ifindex = ctx->ifindex;
	asm volatile("" : "+r"(ifindex)); /* one load of the field: no kept pointer into ctx */
	if (f && f->out_ifindex == ifindex)
		return 0;
	struct prg_pod *pod = NULL;
	int r = prg_pod_lookup4(&prg_fastpath_ep, &prg_fastpath_port, cfg->netns, saddr, &pod);
	return src_owner(ifindex, r, pod);
}

/* refuse_out hands a frame src_refused refused (reason r) to the normal path, to learn nothing. */
static __always_inline int refuse_out(struct __sk_buff *ctx, __u32 r)
{
	if (!ctx->tc_index)
		ctx->tc_index = FP_TC_INDEX_NOOUT;
	count(FP_DIR_TX, r);
	return TCX_NEXT;
}

static __always_inline int handover_out_src(struct fp_flow *f, struct fp_key *k, const struct fp_pkt *p,
					    struct __sk_buff *ctx, __u32 reason, const struct fp_cfg *cfg);

/* handover records what the normal path will be learned from and lets the packet go there
 * (a frame whose source src_refused refuses: untouched, counted as such). */
static __always_inline int handover_out(struct fp_flow *f, struct fp_key *k, const struct fp_pkt *p,
					struct __sk_buff *ctx, __u32 reason)
{
	struct fp_cfg *cfg = fp_config();
	if (!cfg)
		return TCX_NEXT;
	__u32 sr = src_refused(ctx, cfg, f, p->saddr);
	if (sr)
		return refuse_out(ctx, sr);
	return handover_out_src(f, k, p, ctx, reason, cfg);
}

/* handover_out_src is handover_out for a frame whose source was checked. */
static __always_inline int handover_out_src(struct fp_flow *f, struct fp_key *k, const struct fp_pkt *p,
					    struct __sk_buff *ctx, __u32 reason, const struct fp_cfg *cfg)
{
	struct fp_flow *e = f;
	if (f && reason == FP_R_MISS && dir_fresh(f, 1, cfg->gen, ctx->ifindex)) {
		f->seen_ns = bpf_ktime_get_ns(); /* still sending: a pending entry lives on */
		e = NULL;
	} else if (f) {
		seen_out(f, cfg->gen, p->ttl, ctx->ifindex);
	} else {
		struct fp_flow nf = {.out_ttl_seen = p->ttl, .out_ifindex = ctx->ifindex};
		e = flow_new(cfg, k, &nf, FP_DIR_TX);
	}
	if (!e) { /* over budget, the table full, or dir_fresh: nothing to learn (FP_TC_INDEX_NOOUT) */
		if (!ctx->tc_index)
			ctx->tc_index = FP_TC_INDEX_NOOUT;
		if (f && (f->flags & FP_F_NATX) && reason == FP_R_MISS)
			reason = FP_R_NAT;
		count(FP_DIR_TX, reason);
		return TCX_NEXT;
	}
	/* Remember the key, so the learner can tie a translated frame (a Service's DNAT) to it. */
	__u32 zero = 0;
	struct fp_ho *ho = bpf_map_lookup_elem(&prg_fastpath_ho, &zero);
	struct fp_hob *hb = bpf_map_lookup_elem(&prg_fastpath_hob, &zero);
	if (ho && hb && !ctx->tc_index) {
		ho->k = *k;
		nat_bind(ctx, sizeof(struct ethhdr), p->proto, hb->bind); /* which frame (fastpath_nat.h) */
		ctx->tc_index = FP_TC_INDEX_OUT;
	}
	if (f && (f->flags & FP_F_NATX) && reason == FP_R_MISS)
		reason = FP_R_NAT;
	count(FP_DIR_TX, reason);
	return TCX_NEXT;
}

static __always_inline int handover_in(struct __sk_buff *ctx, struct fp_flow *f, struct fp_key *k,
				       const struct fp_pkt *p, __u32 vtep, __u32 reason)
{
	struct fp_cfg *cfg = fp_config();
	if (!cfg)
		return TCX_NEXT;
	/* Keep the frame on the normal path up to the learner (prism would redirect an HP frame
	 * from the VXLAN device past it, and its flow would never be learned); a flow without an
	 * entry (over budget, the table full) or only the fresh ingress direction (dir_fresh) has
	 * nothing to learn: FP_TC_INDEX_NOIN. */
	struct fp_flow *e = f;
	if (f && reason == FP_R_MISS && dir_fresh(f, 0, cfg->gen, 0)) {
		f->seen_ns = bpf_ktime_get_ns();
		e = NULL;
	} else if (f) {
		seen_in(f, cfg->gen, p->ttl);
	} else {
		struct fp_flow nf = {.in_ttl_seen = p->ttl, .vtep = vtep};
		e = flow_new(cfg, k, &nf, FP_DIR_RX);
	}
	if (!ctx->tc_index)
		ctx->tc_index = e ? PRG_TC_INDEX_LEARN : FP_TC_INDEX_NOIN;
	count(FP_DIR_RX, reason);
	return TCX_NEXT;
}

#include "fastpath_closed.h"

/* closing_mark sets fin (and FP_F_CLOSING) in flow f of either family; 1 and the flags before
 * (*old) when this changed them, for closed_due. */
static __always_inline int closing_mark(struct fp_flow *f, __u32 fin, __u32 *old)
{
	if (!f || (f->flags & FP_F_ALIAS) || (f->flags & (FP_F_CLOSING | fin)) == (FP_F_CLOSING | fin))
		return 0;
	if (!(f->flags & FP_F_CLOSING))
		f->seen_ns = bpf_ktime_get_ns();
	*old = __sync_fetch_and_or(&f->flags, FP_F_CLOSING | fin);
	return 1;
}

/* closing: a TCP FIN or RST of the flow of key k (normal path: conntrack sees the connection
 * close), fin saying whose (FP_F_FIN_OUT, FP_F_FIN_IN, FP_F_DONE for a RST), dir the
 * direction counting a lost hand-over. The flow's entry goes FP_CLOSE_NS after the first,
 * unless a SYN reopens it: short connections leave the table as fast as they come. */
static __always_inline void closing(struct __sk_buff *ctx, struct fp_key *k, __u32 fin, __u32 dir)
{
	__u32 old;
	if (closing_mark(bpf_map_lookup_elem(&prg_fastpath_flow, k), fin, &old))
		closed_push(ctx, k, old, fin, dir);
}

/* fin_fast: the FIN or RST of flow k takes the fast path (FP_F_HSONLY), when the rest of
 * the lookup lets it. */
static __always_inline int fin_fast_flow(const struct fp_flow *f)
{
	return f && !(f->flags & (FP_F_ALIAS | FP_F_LOCAL)) && (f->flags & FP_F_HSONLY);
}

static __always_inline int fin_fast(struct fp_key *k)
{
	return fin_fast_flow(bpf_map_lookup_elem(&prg_fastpath_flow, k));
}

/* hs_learned records what a learner learned a TCP direction from: a SYN (SYN-ACK) leaves the
 * connection handshake-only as far as conntrack knows, anything else ends that (FP_F_HSONLY). */
static __always_inline void hs_learned_at(struct fp_flow *f, __u8 proto, __u8 ctl)
{
	if (proto != IPPROTO_TCP)
		return;
	if (ctl == FP_TCP_SYN)
		__sync_fetch_and_or(&f->flags, FP_F_HSONLY);
	else if (f->flags & FP_F_HSONLY)
		__sync_fetch_and_and(&f->flags, ~FP_F_HSONLY);
}

static __always_inline void hs_learned(struct fp_flow *f, const struct fp_pkt *p)
{
	hs_learned_at(f, p->proto, p->ctl);
}

/* lookup_flow checks flow f (of either family, looked up by key) for the fast path; lookup finds
 * the IPv4 flow of key k; *reason is MISS (not learned both ways, or of an older
 * generation) or STALE (this direction is due for re-learning) when it cannot take the fast
 * path. */
static __always_inline struct fp_flow *lookup_flow(struct fp_flow *f, int out, __u32 need, __u32 gen, __u32 *reason)
{
	if (!f) {
		*reason = FP_R_MISS;
		return NULL;
	}
	if ((f->flags & need) != need || f->gen != gen) {
		*reason = FP_R_MISS;
		return f;
	}
	__u64 then = out ? f->out_ns : f->in_ns;
	if (bpf_ktime_get_coarse_ns() - then > FP_REVALIDATE_NS) {
		*reason = FP_R_STALE;
		return f;
	}
	*reason = FP_R_HIT;
	return f;
}

static __always_inline struct fp_flow *lookup(struct fp_key *k, int out, __u32 need, __u32 gen, __u32 *reason)
{
	return lookup_flow(bpf_map_lookup_elem(&prg_fastpath_flow, k), out, need, gen, reason);
}

static __always_inline __u32 local_reply_due(struct __sk_buff *ctx, struct fp_flow *f, const struct fp_pkt *p);

/* syn_out/syn_in: a connection's SYN (or SYN-ACK) takes the normal path, which conntrack and
 * the firewall decide on, and is learned at its far end like any handed-over packet: a
 * connection is fast from its first packet after the handshake (the third ACK, the request),
 * not only after its first data went both ways. A new connection on the key of a closing one
 * (a reused port) is a flow again. */
static __always_inline void syn_open(struct fp_flow *f)
{
	if (f && (f->flags & (FP_F_CLOSING | FP_F_DONE)))
		__sync_fetch_and_and(&f->flags, ~(FP_F_CLOSING | FP_F_DONE));
}

/* local_syn: a new connection on the key of a same-node flow (either family; a reused port, the
 * old one's entry lingering FP_CLOSE_NS) is learned anew from its own first data, not carried on
 * the old learn, both directions: else its third ACK or first data would ride the fast path and
 * the other end's first segment or FIN meet a conntrack entry that never saw them (INVALID,
 * dropped by kube-proxy's KUBE-FORWARD; see local_learn). Called with a SYN or SYN-ACK at the
 * sender's veth. */
static __always_inline void local_syn(struct fp_flow *f)
{
	if (f && (f->flags & FP_F_LOCAL) && (f->flags & (FP_F_OUT | FP_F_IN)))
		__sync_fetch_and_and(&f->flags, ~(FP_F_OUT | FP_F_IN));
}

/* begin_out is the common start of the egress programs: parse, look up, hand over what cannot
 * take the fast path. NULL: the packet goes the normal path (counted). */
static __always_inline struct fp_flow *begin_out(struct __sk_buff *ctx, const struct fp_cfg *cfg, struct fp_pkt *p,
						 struct fp_key *k)
{
	__u32 r = parse(ctx, 0, p);
	if (r == FP_R_NOTIP && ctx->len > FP_IP_MAX + sizeof(struct ethhdr))
		r = parse_big(ctx, p);
	if (r) {
		count(FP_DIR_TX, r);
		return NULL;
	}
	key_out(k, p);
	if (p->ctl) {
		struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow, k);
		if (p->ctl == FP_TCP_SYN) { /* SYN, SYN-ACK: learned from the normal path */
			__u32 sr = src_refused(ctx, cfg, f, p->saddr); /* before it reopens the flow */
			if (sr) {
				refuse_out(ctx, sr);
				return NULL;
			}
			syn_open(f);
			local_syn(f);
			handover_out_src(f, k, p, ctx, FP_R_PROTO, cfg);
			return NULL;
		}
		if (f) { /* a forged FIN or RST would close another pod's flow */
			__u32 sr = src_refused(ctx, cfg, f, p->saddr);
			if (sr) {
				refuse_out(ctx, sr);
				return NULL;
			}
		}
		closing(ctx, k, p->ctl & FP_TCP_RST ? FP_F_DONE : FP_F_FIN_OUT, FP_DIR_TX);
		if (!fin_fast(k)) {
			count(FP_DIR_TX, FP_R_PROTO);
			return NULL;
		}
		/* A short connection's FIN or RST: on the fast path like its data (FP_F_HSONLY). */
	}
	struct fp_flow *f = lookup(k, 1, FP_F_OUT | FP_F_IN, cfg->gen, &r);
	if (r == FP_R_STALE && f && (f->flags & FP_F_SNAT))
		r = local_reply_due(ctx, f, p); /* fastpath_local.h */
	if (r != FP_R_HIT) {
		handover_out(f, k, p, ctx, r);
		return NULL;
	}
	return f;
}

/* begin_in is the same for the ingress programs, the inner frame at off. */
static __always_inline struct fp_flow *begin_in(struct __sk_buff *ctx, __u32 off, struct fp_pkt *p, struct fp_key *k,
						__u32 vtep, const struct fp_cfg *cfg)
{
	/* One-way (opt-in): a flow the normal path delivered to the pod needs no reply first. */
	__u32 need = cfg->flags & FP_C_ONEWAY ? FP_F_IN : FP_F_OUT | FP_F_IN;
	__u32 r = parse(ctx, off, p);
	if (r) {
		count(FP_DIR_RX, r);
		return NULL;
	}
	key_in(k, p);
	if (p->ctl) {
		__u32 be_remote = k->remote;
		__u16 be_rport = k->rport;
		struct fp_flow *f = bpf_map_lookup_elem(&prg_fastpath_flow, k);
		if (f && (f->flags & FP_F_DNAT))
			goto from_service;
		if (f && (f->flags & FP_F_ALIAS)) {
			/* A Service backend's SYN-ACK, FIN or RST: the pod's flow, by the Service address. */
			k->remote = f->nat_addr;
			k->rport = f->nat_port;
			f = bpf_map_lookup_elem(&prg_fastpath_flow, k);
		}
		if (p->ctl == FP_TCP_SYN) {
			syn_open(f);
			handover_in(ctx, f, k, p, vtep, FP_R_PROTO);
			return NULL;
		}
		closing(ctx, k, p->ctl & FP_TCP_RST ? FP_F_DONE : FP_F_FIN_IN, FP_DIR_RX);
		if (!fin_fast(k)) {
			count(FP_DIR_RX, FP_R_PROTO);
			return NULL;
		}
		/* A short connection's FIN or RST rides the fast path (FP_F_HSONLY); a Service
		 * backend's goes by the backend's key, as its data does. */
		k->remote = be_remote;
		k->rport = be_rport;
	}
	struct fp_flow *f = lookup(k, 0, need, cfg->gen, &r);
	if (f && (f->flags & FP_F_DNAT))
		goto from_service;
	if (f && (f->flags & FP_F_ALIAS)) {
		/* A reply from a Service's backend: the flow is the pod's, keyed by the Service
		 * address it sent to, and the normal path (and its learner) sees the reply with
		 * that address as its source once conntrack has reversed the translation. */
		__u32 be_addr = k->remote;
		__u16 be_port = k->rport;
		k->remote = f->nat_addr;
		k->rport = f->nat_port;
		f = lookup(k, 0, need, cfg->gen, &r);
		if (f && (!(f->flags & FP_F_DNAT) || f->nat_addr != be_addr || f->nat_port != be_port)) {
			/* The flow is no longer translated to this backend: relearn from the normal path. */
			count(FP_DIR_RX, FP_R_STALE);
			return NULL;
		}
		/* A Service reply is re-learned only after the egress direction was: should
		 * conntrack's entry be gone (flushed, expired), the pod's packet re-creates it with
		 * its translation, where a reply first would reach the pod untranslated (and the
		 * pod's RST would end the connection). Bounded: at most 2 intervals old.
		 * The egress may have been re-learned after the ingress and the entry be gone
		 * since (conntrack -F, before the agent's watch made the flow due): then
		 * out_ns > in_ns says nothing, so conntrack is asked (once per revalidation). */
		if (r == FP_R_STALE && bpf_ktime_get_coarse_ns() - f->in_ns <= 2 * FP_REVALIDATE_NS &&
		    (f->out_ns <= f->in_ns || !ct_known4(ctx, k)))
			r = FP_R_HIT;
	}
	if (r != FP_R_HIT) {
		handover_in(ctx, f, k, p, vtep, r);
		return NULL;
	}
	return f;
from_service:
	/* k is a translated flow's own key: a frame from the Service address itself, which the
	 * normal path never sends over the overlay (conntrack reverses the translation on the
	 * client's node). A forgery: left to the normal path (whose conntrack refuses it) without
	 * touching the flow, not even for a FIN or RST (as nat6_in, fastpath_nat6.h). */
	count(FP_DIR_RX, FP_R_NAT);
	return NULL;
}

/* learned_out completes the learning of flow f's egress direction (either family) from a frame
 * the normal path encapsulated to vtep with inner TTL/hop limit ttl, after its template. */
static __always_inline void learned_out(struct fp_flow *f, __u32 vtep, __u8 ttl, __u8 proto, __u8 ctl)
{
	f->vtep = vtep;
	ttl_learned(&f->out_ttl_seen, &f->out_ttl_dec, ttl);
	f->out_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory"); /* the template before the flag */
	f->flags |= FP_F_OUT;
	hs_learned_at(f, proto, ctl);
	count(FP_DIR_TX, FP_R_LEARN);
}

/* learned_in learns flow f's ingress direction (either family) from a frame the normal path
 * delivers to a pod on ifindex with Ethernet header eth and inner TTL/hop limit ttl. */
static __always_inline void learned_in(struct fp_flow *f, const struct ethhdr *eth, __u32 ifindex, __u8 ttl,
				       __u8 proto, __u8 ctl)
{
	__builtin_memcpy(f->in_mac, eth->h_dest, 6);
	__builtin_memcpy(f->in_mac + 6, eth->h_source, 6);
	f->in_ifindex = ifindex;
	ttl_learned(&f->in_ttl_seen, &f->in_ttl_dec, ttl);
	f->in_ns = bpf_ktime_get_coarse_ns();
	asm volatile("" ::: "memory");
	f->flags |= FP_F_IN;
	hs_learned_at(f, proto, ctl);
	count(FP_DIR_RX, FP_R_LEARN);
}

/* ttl_sub_ip lowers an IPv4 header's TTL by dec, updating its checksum incrementally
 * (RFC 1624: TTL shares a 16-bit word with the protocol byte). The header must be writable. */
static __always_inline void ttl_sub_ip(struct iphdr *ip, __u8 dec)
{
	if (!dec)
		return;
	__u16 oldw = *(__u16 *)&ip->ttl;
	ip->ttl -= dec;
	__u16 neww = *(__u16 *)&ip->ttl;
	__u32 c = (~bpf_ntohs(ip->check) & 0xffff) + (~bpf_ntohs(oldw) & 0xffff) + bpf_ntohs(neww);
	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	ip->check = bpf_htons(~c & 0xffff);
}

/* ip_csum is the checksum of an option-less IPv4 header whose check field is 0. */
static __always_inline __u16 ip_csum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 c = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		c += w[i];
	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return ~c;
}

#include "fastpath_local.h"

#endif /* PRG_FASTPATH_H */
