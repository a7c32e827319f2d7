// SPDX-License-Identifier: GPL-2.0
/*
 * prism: PRISM's run-to-completion ("sync mode") for high-priority (HP) overlay flows.
 *
 * prg_prism_vx runs at tc (tcx) ingress of the VXLAN device, i.e. on the decapsulated inner
 * frame right after the VXLAN gro_cell stage. It classifies the frame by its inner headers
 * against an ordered rule list; a frame that matches a rule (HP) is handed with
 * bpf_redirect_peer() straight to the container's eth0, so it never meets the bridge, the veth
 * transmit and the per-CPU backlog stage (the third queue of the overlay receive path). Every
 * other frame returns TCX_NEXT (so programs attached after it still run) and takes the normal
 * path untouched.
 *
 * The HP frame must look exactly as the normal path would deliver it:
 *  - docker style (VXLAN enslaved to a bridge, L2): the inner dst MAC is already the
 *    container's and the bridge forwards it unchanged, so the frame is not modified. Only
 *    skb->pkt_type is fixed: the VXLAN device saw a foreign dst MAC (PACKET_OTHERHOST) where
 *    the veth's eth_type_trans would have said PACKET_HOST, and ip_rcv drops OTHERHOST.
 *  - flannel style (routed VXLAN, no master): the normal path IP-forwards the frame out of the
 *    container bridge (cni0): src MAC = bridge MAC, dst MAC = container MAC, IPv4 TTL - 1 with
 *    the header checksum updated incrementally, IPv6 hop limit - 1. Frames whose TTL would
 *    expire take the normal path (it sends the ICMP error).
 *
 * Where the frame goes comes from prg_prism_ep (inner dst IP -> bridge-side veth), kept by
 * userspace. Stale redirects are impossible by construction: the veth is also held in a
 * DEVMAP_HASH slot (prg_prism_port) and the kernel removes a devmap entry when its device is
 * unregistered, so a vanished container (or a reused ifindex) finds no slot, and the frame is
 * dropped and counted instead of reaching whatever device now has that ifindex. Endpoints that
 * userspace saw vanish stay as tombstones for a while, so their HP frames are dropped and
 * counted too.
 *
 * The firewall gate (accepted, in prism_gate.h): an HP frame is redirected only when the normal path
 * accepted its flow (a confirmed conntrack entry, the TCP reply seen, and a frame of the flow
 * delivered to the pod, through the endpoint's own veth, within the window: prg_prism_dlv records
 * that at the pod's device, after everything the normal path does); opening packets, flushed
 * flows and flows anything on the normal path stopped delivering take the normal path, so prism
 * never bypasses a firewall, a bridge filter or tc, and never delivers where the normal path
 * would not.
 *
 * A frame the fast path (fastpath.bpf.c) handed to the normal path to learn its flow carries
 * PRG_TC_INDEX_LEARN and is left on the normal path, so prism stacked over the fast path does not
 * keep HP flows off it.
 *
 * Rules are double-buffered: userspace fills the inactive half of prg_prism_rule, then flips
 * prg_prism_cfg.set, so a rule change is atomic for every packet.
 *
 * HP isolation (--hp-cpus): prg_prism_nic runs at tcx ingress of the underlay, i.e. in the NIC
 * stage after its GRO and before vxlan_rcv. It classifies the *inner* frame of every VXLAN frame
 * with the same rules and writes an L4 hash (bpf_set_hash) that the VXLAN device's RPS maps to a
 * reserved CPU for HP and to a non-reserved one for everything else (bpf/rps.h). From the VXLAN
 * device on (its RPS backlog, prg_prism_vx, the bridge or the redirect, the container's stack)
 * HP then runs on the reserved CPUs and never shares a backlog with bulk traffic. A packet whose
 * NIC stage already runs on a CPU of its class (LP on a non-reserved IRQ core) gets hash 0 and
 * stays there without an RPS hop, exactly as on the vanilla path. The NIC stage and the VXLAN
 * gro_cell, which run before RPS, stay shared (see gen.go).
 */
#include "common.h"
#include "rps.h"
#include "vxlan.h"

char LICENSE[] SEC("license") = "GPL";

#define PR_MAX_RULES 64
#define PR_MAX_EPS 4096
#define PR_MAX_DEVS 64

#define PR_TCX_NEXT (-1) /* pass on to the next tcx program, or the stack: we are not the last word */
#define PR_TC_ACT_SHOT 2
#define PR_PACKET_HOST 0

/* Rule criteria present (prism_rule.flags). Absent criteria match anything. */
#define PR_R_PROTO 1
#define PR_R_SPORT 2
#define PR_R_DPORT 4
#define PR_R_SRC 8
#define PR_R_DST 16
#define PR_R_DSCP 32

/* Endpoint flags. */
#define PR_EP_GONE 1 /* the container vanished: drop its HP frames */

/* Counters (prg_prism_stat index). Keep in step with the Go side's names. */
enum {
	PR_ST_SEEN,     /* frames at the VXLAN device */
	PR_ST_UNPARSED, /* not IPv4/IPv6, VLAN-tagged, short or malformed: normal path */
	PR_ST_FRAG,     /* IP fragments: no ports, so port rules never match them */
	PR_ST_LP,       /* no rule matched: normal path */
	PR_ST_HP,       /* a rule matched */
	PR_ST_REDIR,    /* HP, redirected to the container */
	PR_ST_MISS,     /* HP, no endpoint for the inner dst IP: normal path */
	PR_ST_GONE,     /* HP, endpoint vanished (tombstone): dropped */
	PR_ST_STALE,    /* HP, endpoint's veth no longer registered (devmap slot gone): dropped */
	PR_ST_L2,       /* HP, dst MAC is not what the normal path forwards: normal path */
	PR_ST_TTL,      /* HP, routed and TTL/hop limit would expire: normal path */
	PR_ST_ERR,      /* HP, a header rewrite failed: dropped */
	PR_ST_NODEV,    /* the program runs on a device it was not configured for: normal path */
	/* prg_prism_nic (HP isolation), per frame at the underlay */
	PR_ST_ISO_VX,   /* VXLAN frames seen (outer UDP to a VXLAN port) */
	PR_ST_ISO_HP,   /* steered to a reserved CPU */
	PR_ST_ISO_LP,   /* steered to a non-reserved CPU (including inner frames rules can't read) */
	PR_ST_ISO_OFF,  /* isolation not configured, or no CPU to steer to: untouched */
	PR_ST_ISO_STAY, /* of HP+LP: already on a CPU of its class, kept there (hash 0: no RPS hop) */
	PR_ST_LEARN,    /* HP, the fast path is learning the flow from the normal path: normal path */
	/* The firewall gate (HP frames the normal path has not accepted take the normal path) */
	PR_ST_NOTCPUDP, /* HP but not TCP/UDP with ports (ICMP, fragments...): conntrack can't be asked */
	PR_ST_NOCT,     /* HP, no conntrack entry for the flow (new, flushed, or no conntrack there) */
	PR_ST_CTNEW,    /* HP, the entry is unconfirmed, or TCP without a reply seen yet */
	PR_ST_UNSEEN,   /* HP, the normal path did not forward the flow within the window */
	PR_ST_PROBE,    /* HP, re-verification: one frame per interval through the normal path */
	PR_ST_DLV,      /* prg_prism_dlv: HP frames the normal path delivered to a pod (recorded) */
	PR_ST_ELSEWHERE, /* HP, the normal path delivered the flow through another veth or MAC than the endpoint's */
	PR_ST_DLV_NOPOD, /* prg_prism_dlv: a tagged frame at a device userspace did not describe: not recorded */
	PR_ST_STRICT,   /* HP TCP, its conntrack entry tracks windows strictly (not yet marked liberal): normal path */
	PR_ST_ASKLOST,  /* of those, an ask to the agent that did not fit in prg_prism_ask (no agent reading it) */
	PR_ST_N,
};

struct prism_rule {
	__u32 id;    /* counter slot in prg_prism_rcnt */
	__u8 family; /* 0 any, 4, 6 */
	__u8 proto;
	__u8 dscp;
	__u8 flags;  /* PR_R_* */
	__u16 sport_lo, sport_hi, dport_lo, dport_hi; /* host order, inclusive */
	__u32 src[4], smask[4], dst[4], dmask[4];     /* network order, src = src & smask; IPv4 in [0] */
};

struct prism_cfg {
	__u32 set;  /* active half of prg_prism_rule: 0 or 1 */
	__u32 n[2]; /* rules in each half */
	__u32 pad;
	__u64 verify_ns; /* send one frame per flow through the normal path this often */
	__u64 window_ns; /* redirect only if the normal path forwarded the flow this recently */
};

/* What a VXLAN device the program is attached to decides. */
struct prism_dev {
	__u8 mac[6]; /* the device's own MAC: the inner dst MAC of routed (flannel) frames */
	__u8 routed; /* 1: flannel-like L3 forwarding to the bridge; 0: docker-like L2 bridge */
	__u8 pad;
};

struct prism_ep_key {
	__u32 netns;  /* domain: netns inode of the VXLAN device (docker overlays may reuse IPs) */
	__u32 family; /* 4 or 6 */
	__u32 addr[4];
};

struct prism_ep {
	__u32 slot;       /* key of the veth in prg_prism_port */
	__u32 ifindex;    /* bridge-side veth, in the VXLAN device's namespace */
	__u8 ctr_mac[6];  /* the container's eth0 */
	__u8 br_mac[6];   /* the bridge the veth is enslaved to (routed style's source MAC) */
	__u32 flags;      /* PR_EP_* */
	__u64 gone_ns;    /* userspace's clock when it marked the endpoint gone (expiry) */
};

/* HP isolation: the VXLAN devices' RPS map is the CPU set S (ascending, n entries); HP goes to
 * S[hp_idx[...]], everything else to S[lp_idx[...]]. n == 0: isolation off. */
#define PR_MAX_CPUS 256
struct prism_iso {
	__u32 n;
	__u32 hp_count;
	__u32 lp_count;
	__u16 vxlan_ports[PRG_VXLAN_MAX_PORTS]; /* outer UDP ports carrying VXLAN (vxlan.h) */
	__u16 hp_idx[PR_MAX_CPUS];
	__u16 lp_idx[PR_MAX_CPUS];
};

/* Class of a CPU id in prg_prism_cpucls. */
#define PR_CLS_HP 1
#define PR_CLS_LP 2
#define PR_MAX_CPU_ID 4096

/* The last steering decision on this CPU (tests read it, people may). */
struct prism_last {
	__u32 hp;   /* 1 HP, 0 LP */
	__u32 idx;  /* index into S; PR_IDX_STAY: kept on this CPU */
	__u32 hash; /* skb->hash as RPS will read it */
	__u32 flow_hash;
	__u32 cpu;  /* the CPU the NIC stage (and the VXLAN gro_cell) runs on */
	__u32 pad;
};
#define PR_IDX_STAY 0xffff

struct prism_rcnt {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct prism_cfg);
} prg_prism_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * PR_MAX_RULES);
	__type(key, __u32);
	__type(value, struct prism_rule);
} prg_prism_rule SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PR_MAX_DEVS);
	__type(key, struct prg_dev_key);
	__type(value, struct prism_dev);
} prg_prism_dev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PR_MAX_EPS);
	__type(key, struct prism_ep_key);
	__type(value, struct prism_ep);
} prg_prism_ep SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, PR_MAX_EPS);
	__type(key, __u32);
	__type(value, struct bpf_devmap_val);
} prg_prism_port SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PR_ST_N);
	__type(key, __u32);
	__type(value, __u64);
} prg_prism_stat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PR_MAX_RULES);
	__type(key, __u32);
	__type(value, struct prism_rcnt);
} prg_prism_rcnt SEC(".maps");

/* The isolation config is double-buffered so that changing it is atomic: prg_prism_iso and
 * prg_prism_cpucls hold two slots, userspace fills the one not in use and then flips
 * prg_prism_isoact[0] to it; the program reads the flip once per packet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct prism_iso);
} prg_prism_iso SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} prg_prism_isoact SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct prism_last);
} prg_prism_last SEC(".maps");

/* slot * PR_MAX_CPU_ID + CPU id -> PR_CLS_* (0: in neither set). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * PR_MAX_CPU_ID);
	__type(key, __u32);
	__type(value, __u8);
} prg_prism_cpucls SEC(".maps");

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

static __always_inline void count(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&prg_prism_stat, &i);
	if (c)
		*c += 1;
}

static __always_inline int addr_in(const __u32 *a, const __u32 *net, const __u32 *mask)
{
	return (a[0] & mask[0]) == net[0] && (a[1] & mask[1]) == net[1] &&
	       (a[2] & mask[2]) == net[2] && (a[3] & mask[3]) == net[3];
}

/* rule_matches applies one rule to the inner headers (bpf/parse.h). */
static __always_inline int rule_matches(const struct prism_rule *r, const struct prg_hdrs *p)
{
	if (r->family && r->family != p->family)
		return 0;
	if ((r->flags & PR_R_PROTO) && r->proto != p->flow.proto)
		return 0;
	if ((r->flags & PR_R_DSCP) && r->dscp != p->dscp)
		return 0;
	if (r->flags & (PR_R_SPORT | PR_R_DPORT)) {
		if (!p->has_ports)
			return 0;
		__u16 sport = bpf_ntohs(p->flow.sport), dport = bpf_ntohs(p->flow.dport);
		if ((r->flags & PR_R_SPORT) && (sport < r->sport_lo || sport > r->sport_hi))
			return 0;
		if ((r->flags & PR_R_DPORT) && (dport < r->dport_lo || dport > r->dport_hi))
			return 0;
	}
	if ((r->flags & PR_R_SRC) && !addr_in(p->flow.saddr, r->src, r->smask))
		return 0;
	if ((r->flags & PR_R_DST) && !addr_in(p->flow.daddr, r->dst, r->dmask))
		return 0;
	return 1;
}

struct pr_match {
	struct prg_hdrs p;
	__u32 base; /* first index of the active half */
	__s32 hit;  /* matching rule's index in prg_prism_rule, -1 none */
};

/* One rule per bpf_loop step: the verifier checks the body once, not 64 times. */
static long match_one(__u32 i, void *data)
{
	struct pr_match *m = data;
	__u32 k = m->base + i;
	struct prism_rule *r = bpf_map_lookup_elem(&prg_prism_rule, &k);
	if (!r)
		return 1;
	if (rule_matches(r, &m->p)) {
		m->hit = k;
		return 1;
	}
	return 0;
}

/* classify runs the active rules over m->p; m->hit is the first matching rule or -1. It returns
 * the configuration it read (NULL: none, and no match). */
static __always_inline struct prism_cfg *classify(struct pr_match *m)
{
	__u32 zero = 0;
	struct prism_cfg *cfg = bpf_map_lookup_elem(&prg_prism_cfg, &zero);
	if (!cfg)
		return 0;
	__u32 set = cfg->set & 1;
	__u32 n = set ? cfg->n[1] : cfg->n[0];
	if (n > PR_MAX_RULES)
		n = PR_MAX_RULES;
	m->base = set * PR_MAX_RULES;
	bpf_loop(n, match_one, m, 0);
	return cfg;
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

/* route_rewrite does what IP forwarding out of the bridge does to the frame. 0 on success. */
static __always_inline int route_rewrite(struct __sk_buff *ctx, const struct prg_hdrs *p,
					 const struct prism_ep *ep)
{
	__u8 macs[12];
	__builtin_memcpy(macs, ep->ctr_mac, 6);
	__builtin_memcpy(macs + 6, ep->br_mac, 6);
	if (bpf_skb_store_bytes(ctx, 0, macs, sizeof(macs), 0))
		return -1;
	if (p->family == 4) {
		/* TTL shares a 16-bit checksum word with the protocol byte. */
		__u32 woff = sizeof(struct ethhdr) + offsetof(struct iphdr, ttl);
		__u16 oldw, neww;
		if (bpf_skb_load_bytes(ctx, woff, &oldw, sizeof(oldw)))
			return -1;
		neww = oldw;
		((__u8 *)&neww)[0] -= 1;
		if (bpf_l3_csum_replace(ctx, sizeof(struct ethhdr) + offsetof(struct iphdr, check), oldw, neww,
					sizeof(neww)))
			return -1;
		if (bpf_skb_store_bytes(ctx, woff, &neww, sizeof(neww), 0))
			return -1;
	} else {
		__u8 hl = p->ttl - 1;
		if (bpf_skb_store_bytes(ctx, sizeof(struct ethhdr) + offsetof(struct ipv6hdr, hop_limit), &hl,
					1, 0))
			return -1;
	}
	return 0;
}

#include "prism_gate.h" /* the firewall gate and prg_prism_dlv */

SEC("tcx/ingress")
int prg_prism_vx(struct __sk_buff *ctx)
{
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
	struct prg_dev_key dk = {};
	struct net_device *nd = skb->dev;
	struct pr_match m = {.hit = -1};
	struct prg_pkt pkt;
	__u8 dmac[6];
	int pr;

	count(PR_ST_SEEN);
	if (!nd) {
		count(PR_ST_NODEV);
		return PR_TCX_NEXT;
	}
	prg_dev_key_of(nd, &dk);
	struct prism_dev *dev = bpf_map_lookup_elem(&prg_prism_dev, &dk);
	if (!dev) {
		count(PR_ST_NODEV);
		return PR_TCX_NEXT;
	}
	prg_pkt_tc(&pkt, ctx);
	PRG_TC_PARSE(pr, &pkt, ctx, prg_parse_frame(&pkt, 0, 0, &m.p));
	struct ethhdr *eth = prg_hdr(&pkt, 0, struct ethhdr);
	if (pr != PRG_OK || !eth) {
		count(PR_ST_UNPARSED);
		return PR_TCX_NEXT;
	}
	__builtin_memcpy(dmac, eth->h_dest, sizeof(dmac));
	if (m.p.frag)
		count(PR_ST_FRAG);

	struct prism_cfg *cfg = classify(&m);
	if (m.hit < 0 || !cfg) {
		count(PR_ST_LP);
		return PR_TCX_NEXT;
	}
	count(PR_ST_HP);
	if (ctx->tc_index == PRG_TC_INDEX_LEARN) {
		/* The fast path (stacked under prism) hands this frame to the normal path to learn its
		 * flow there; once learned, the flow's frames take the fast path's redirect_peer from
		 * the underlay, before this device, which is where HP wants to be. */
		count(PR_ST_LEARN);
		return PR_TCX_NEXT;
	}
	__u32 hk = m.hit;
	struct prism_rule *r = bpf_map_lookup_elem(&prg_prism_rule, &hk);
	if (r) {
		__u32 id = r->id;
		struct prism_rcnt *rc = bpf_map_lookup_elem(&prg_prism_rcnt, &id);
		if (rc) {
			rc->packets += 1;
			rc->bytes += ctx->len;
		}
	}

	struct prism_ep_key ek = {.netns = dk.netns, .family = m.p.family};
	__builtin_memcpy(ek.addr, m.p.flow.daddr, sizeof(ek.addr));
	struct prism_ep *ep = bpf_map_lookup_elem(&prg_prism_ep, &ek);
	if (!ep) {
		count(PR_ST_MISS);
		return PR_TCX_NEXT;
	}
	if (ep->flags & PR_EP_GONE) {
		count(PR_ST_GONE);
		return PR_TC_ACT_SHOT;
	}
	__u32 slot = ep->slot;
	struct bpf_devmap_val *port = bpf_map_lookup_elem(&prg_prism_port, &slot);
	if (!port || port->ifindex != ep->ifindex) {
		count(PR_ST_STALE);
		return PR_TC_ACT_SHOT;
	}
	if (dev->routed) {
		if (!mac_eq(dmac, dev->mac)) {
			count(PR_ST_L2);
			return PR_TCX_NEXT;
		}
		if (m.p.ttl <= 1) {
			count(PR_ST_TTL);
			return PR_TCX_NEXT;
		}
	} else if (!mac_eq(dmac, ep->ctr_mac)) {
		count(PR_ST_L2);
		return PR_TCX_NEXT;
	}
	if (!accepted(ctx, &m.p, dk.netns, cfg, ep))
		return PR_TCX_NEXT;
	if (dev->routed && route_rewrite(ctx, &m.p, ep)) {
		count(PR_ST_ERR);
		return PR_TC_ACT_SHOT;
	}
	/* The veth's eth_type_trans would have said PACKET_HOST (the dst MAC is the container's). */
	if (bpf_skb_change_type(ctx, PR_PACKET_HOST)) {
		count(PR_ST_ERR);
		return PR_TC_ACT_SHOT;
	}
	count(PR_ST_REDIR);
	return bpf_redirect_peer(port->ifindex, 0);
}

/* ---- HP isolation: prg_prism_nic at the underlay ---- */


/* The compiler knows the bound and drops a mask the verifier (which does not track "%") needs;
 * an empty asm hides the value from it. */
#define pr_bound(x) ({ __u32 __v = (x); asm volatile("" : "+r"(__v)); __v & (PR_MAX_CPUS - 1); })

SEC("tcx/ingress")
int prg_prism_nic(struct __sk_buff *ctx)
{
	__u32 zero = 0;
	struct prg_vxlan vx;
	struct prg_pkt pkt;
	int r;
	__u32 *act = bpf_map_lookup_elem(&prg_prism_isoact, &zero);
	__u32 slot = act ? *act & 1 : 0;
	struct prism_iso *iso = bpf_map_lookup_elem(&prg_prism_iso, &slot);
	if (!iso)
		return PR_TCX_NEXT;
	prg_pkt_tc(&pkt, ctx);
	PRG_TC_PARSE(r, &pkt, ctx, prg_vxlan_outer(&pkt, iso->vxlan_ports, &vx));
	if (r != PRG_OK)
		return PR_TCX_NEXT; /* not overlay traffic: not ours to steer */
	count(PR_ST_ISO_VX);
	__u32 n = iso->n, hp_count = iso->hp_count, lp_count = iso->lp_count;
	if (n == 0 || n > PR_MAX_CPUS || lp_count == 0 || lp_count > PR_MAX_CPUS || hp_count > PR_MAX_CPUS) {
		count(PR_ST_ISO_OFF);
		return PR_TCX_NEXT;
	}

	struct pr_match m = {.hit = -1};
	__u32 fh = 0;
	/* An inner frame the rules cannot read (ARP, VLAN...) is LP: the reserved CPUs carry HP only. */
	PRG_TC_PARSE(r, &pkt, ctx, prg_parse_frame(&pkt, vx.inner, 0, &m.p));
	if (r == PRG_OK) {
		fh = prg_flow_hash(&m.p.flow);
		classify(&m);
	}
	__u32 hp = m.hit >= 0 && hp_count > 0;
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 ck = slot * PR_MAX_CPU_ID + cpu;
	__u8 *cls = cpu < PR_MAX_CPU_ID ? bpf_map_lookup_elem(&prg_prism_cpucls, &ck) : 0;
	__u32 idx = PR_IDX_STAY;
	if (cls && *cls == (hp ? PR_CLS_HP : PR_CLS_LP)) {
		/* The NIC put the packet on a CPU of its class (LP on the IRQ core, typically): keep it
		 * here as the vanilla path would. Hash 0 makes RPS skip it (get_rps_cpu: no hash); any
		 * other hash, even one for this CPU, would cost an extra trip through the backlog. */
		bpf_set_hash(ctx, 0);
		count(PR_ST_ISO_STAY);
	} else {
		idx = hp ? iso->hp_idx[pr_bound(fh % hp_count)] : iso->lp_idx[pr_bound(fh % lp_count)];
		if (idx >= n) { /* a torn update of the map: leave the packet alone */
			count(PR_ST_ISO_OFF);
			return PR_TCX_NEXT;
		}
		bpf_set_hash(ctx, prg_rps_hash(idx, n, fh));
	}
	count(hp ? PR_ST_ISO_HP : PR_ST_ISO_LP);
	struct prism_last *l = bpf_map_lookup_elem(&prg_prism_last, &zero);
	if (l) {
		l->hp = hp;
		l->idx = idx;
		l->hash = ctx->hash;
		l->flow_hash = fh;
		l->cpu = cpu;
	}
	return PR_TCX_NEXT;
}
