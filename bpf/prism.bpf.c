// SPDX-License-Identifier: GPL-2.0
/*
 * prism: PRISM's run-to-completion ("sync mode") for high-priority (HP) overlay flows.
 *
 * prg_prism_vx runs at tc (tcx) ingress of the VXLAN device, i.e. on the decapsulated inner
 * frame right after the VXLAN gro_cell stage. It classifies the frame by its inner headers
 * against an ordered rule list; a frame that matches a rule (HP) is handed with
 * bpf_redirect_peer() straight to the container's eth0, so it never meets the bridge, the veth
 * transmit and the per-CPU backlog stage (the third queue of the overlay receive path). Every
 * other frame returns TC_ACT_OK and takes the normal path untouched.
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
 * Rules are double-buffered: userspace fills the inactive half of prg_prism_rule, then flips
 * prg_prism_cfg.set, so a rule change is atomic for every packet.
 */
#include "common.h"
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "GPL";

#define PR_MAX_RULES 64
#define PR_MAX_EPS 4096
#define PR_MAX_DEVS 64

#define PR_ETH_P_IP 0x0800
#define PR_ETH_P_IPV6 0x86DD
#define PR_TC_ACT_OK 0
#define PR_TC_ACT_SHOT 2
#define PR_PACKET_HOST 0

#define PR_IPPROTO_HOPOPTS 0
#define PR_IPPROTO_TCP 6
#define PR_IPPROTO_UDP 17
#define PR_IPPROTO_ROUTING 43
#define PR_IPPROTO_FRAGMENT 44
#define PR_IPPROTO_DSTOPTS 60
#define PR_IPPROTO_SCTP 132

/* Rule criteria present (prism_rule.flags). Absent criteria match anything. */
#define PR_R_PROTO 1
#define PR_R_SPORT 2
#define PR_R_DPORT 4
#define PR_R_SRC 8
#define PR_R_DST 16
#define PR_R_DSCP 32

/* Endpoint flags. */
#define PR_EP_GONE 1 /* the container vanished: drop its HP frames */

/* Counters (prg_prism_stat index). Keep in step with stats.go. */
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

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* The inner headers the rules look at. */
struct pr_pkt {
	__u32 family;
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport, dport; /* host order, valid with has_ports */
	__u8 proto;
	__u8 dscp;
	__u8 ttl;           /* IPv4 TTL or IPv6 hop limit */
	__u8 has_ports;
	__u8 frag;
};

static __always_inline void count(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&prg_prism_stat, &i);
	if (c)
		*c += 1;
}

static __always_inline int is_l4_with_ports(__u8 p)
{
	return p == PR_IPPROTO_TCP || p == PR_IPPROTO_UDP || p == PR_IPPROTO_SCTP;
}

/* parse reads the inner Ethernet/IP/L4 headers. -1: not something rules apply to (non-IP, a
 * VLAN tag, short or malformed), and the frame goes the normal path untouched. */
static __always_inline int parse(struct __sk_buff *ctx, struct ethhdr *eth, struct pr_pkt *p)
{
	__u32 off = sizeof(*eth), l4;
	__u8 nh;

	if (bpf_skb_load_bytes(ctx, 0, eth, sizeof(*eth)))
		return -1;
	if (eth->h_proto == bpf_htons(PR_ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(ctx, off, &ip, sizeof(ip)))
			return -1;
		if (ip.version != 4 || ip.ihl < 5 || bpf_ntohs(ip.tot_len) < ip.ihl * 4)
			return -1;
		p->family = 4;
		p->saddr[0] = ip.saddr;
		p->daddr[0] = ip.daddr;
		p->proto = ip.protocol;
		p->dscp = ip.tos >> 2;
		p->ttl = ip.ttl;
		/* Only a first fragment carries ports; all fragments of a datagram must share a path,
		 * so none of them is port-classified. */
		if (ip.frag_off & bpf_htons(0x3fff)) {
			p->frag = 1;
			return 0;
		}
		nh = ip.protocol;
		l4 = off + ip.ihl * 4;
	} else if (eth->h_proto == bpf_htons(PR_ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(ctx, off, &ip6, sizeof(ip6)))
			return -1;
		if (ip6.version != 6)
			return -1;
		p->family = 6;
		__builtin_memcpy(p->saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->daddr, &ip6.daddr, 16);
		p->dscp = ((ip6.priority << 4) | (ip6.flow_lbl[0] >> 4)) >> 2;
		p->ttl = ip6.hop_limit;
		nh = ip6.nexthdr;
		l4 = off + sizeof(ip6);
		/* A few extension headers, as real stacks send them; more is unusual enough to leave
		 * to the normal path. */
#pragma unroll
		for (int i = 0; i < 4; i++) {
			__u8 ext[2];
			if (nh != PR_IPPROTO_HOPOPTS && nh != PR_IPPROTO_ROUTING && nh != PR_IPPROTO_DSTOPTS &&
			    nh != PR_IPPROTO_FRAGMENT)
				break;
			if (bpf_skb_load_bytes(ctx, l4, ext, sizeof(ext)))
				return -1;
			if (nh == PR_IPPROTO_FRAGMENT) {
				p->proto = ext[0];
				p->frag = 1;
				return 0;
			}
			nh = ext[0];
			l4 += (ext[1] + 1) * 8;
		}
		if (nh == PR_IPPROTO_HOPOPTS || nh == PR_IPPROTO_ROUTING || nh == PR_IPPROTO_DSTOPTS ||
		    nh == PR_IPPROTO_FRAGMENT)
			return -1;
		p->proto = nh;
	} else {
		return -1;
	}
	if (is_l4_with_ports(nh)) {
		__u16 ports[2];
		if (bpf_skb_load_bytes(ctx, l4, ports, sizeof(ports)))
			return -1; /* truncated L4 header */
		p->sport = bpf_ntohs(ports[0]);
		p->dport = bpf_ntohs(ports[1]);
		p->has_ports = 1;
	}
	return 0;
}

static __always_inline int addr_in(const __u32 *a, const __u32 *net, const __u32 *mask)
{
	return (a[0] & mask[0]) == net[0] && (a[1] & mask[1]) == net[1] &&
	       (a[2] & mask[2]) == net[2] && (a[3] & mask[3]) == net[3];
}

static __always_inline int rule_matches(const struct prism_rule *r, const struct pr_pkt *p)
{
	if (r->family && r->family != p->family)
		return 0;
	if ((r->flags & PR_R_PROTO) && r->proto != p->proto)
		return 0;
	if ((r->flags & PR_R_DSCP) && r->dscp != p->dscp)
		return 0;
	if (r->flags & (PR_R_SPORT | PR_R_DPORT)) {
		if (!p->has_ports)
			return 0;
		if ((r->flags & PR_R_SPORT) && (p->sport < r->sport_lo || p->sport > r->sport_hi))
			return 0;
		if ((r->flags & PR_R_DPORT) && (p->dport < r->dport_lo || p->dport > r->dport_hi))
			return 0;
	}
	if ((r->flags & PR_R_SRC) && !addr_in(p->saddr, r->src, r->smask))
		return 0;
	if ((r->flags & PR_R_DST) && !addr_in(p->daddr, r->dst, r->dmask))
		return 0;
	return 1;
}

struct pr_match {
	struct pr_pkt p;
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

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

/* route_rewrite does what IP forwarding out of the bridge does to the frame. 0 on success. */
static __always_inline int route_rewrite(struct __sk_buff *ctx, const struct pr_pkt *p,
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

SEC("tc")
int prg_prism_vx(struct __sk_buff *ctx)
{
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
	struct prg_dev_key dk = {};
	struct net_device *nd = skb->dev;
	struct pr_match m = {.hit = -1};
	struct ethhdr eth;
	__u32 zero = 0;

	count(PR_ST_SEEN);
	if (!nd) {
		count(PR_ST_NODEV);
		return PR_TC_ACT_OK;
	}
	prg_dev_key_of(nd, &dk);
	struct prism_dev *dev = bpf_map_lookup_elem(&prg_prism_dev, &dk);
	if (!dev) {
		count(PR_ST_NODEV);
		return PR_TC_ACT_OK;
	}
	if (parse(ctx, &eth, &m.p)) {
		count(PR_ST_UNPARSED);
		return PR_TC_ACT_OK;
	}
	if (m.p.frag)
		count(PR_ST_FRAG);

	struct prism_cfg *cfg = bpf_map_lookup_elem(&prg_prism_cfg, &zero);
	if (!cfg) {
		count(PR_ST_LP);
		return PR_TC_ACT_OK;
	}
	__u32 set = cfg->set & 1;
	__u32 n = set ? cfg->n[1] : cfg->n[0];
	if (n > PR_MAX_RULES)
		n = PR_MAX_RULES;
	m.base = set * PR_MAX_RULES;
	bpf_loop(n, match_one, &m, 0);
	if (m.hit < 0) {
		count(PR_ST_LP);
		return PR_TC_ACT_OK;
	}
	count(PR_ST_HP);
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
	__builtin_memcpy(ek.addr, m.p.daddr, sizeof(ek.addr));
	struct prism_ep *ep = bpf_map_lookup_elem(&prg_prism_ep, &ek);
	if (!ep) {
		count(PR_ST_MISS);
		return PR_TC_ACT_OK;
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
		if (!mac_eq(eth.h_dest, dev->mac)) {
			count(PR_ST_L2);
			return PR_TC_ACT_OK;
		}
		if (m.p.ttl <= 1) {
			count(PR_ST_TTL);
			return PR_TC_ACT_OK;
		}
		if (route_rewrite(ctx, &m.p, ep)) {
			count(PR_ST_ERR);
			return PR_TC_ACT_SHOT;
		}
	} else if (!mac_eq(eth.h_dest, ep->ctr_mac)) {
		count(PR_ST_L2);
		return PR_TC_ACT_OK;
	}
	/* The veth's eth_type_trans would have said PACKET_HOST (the dst MAC is the container's). */
	if (bpf_skb_change_type(ctx, PR_PACKET_HOST)) {
		count(PR_ST_ERR);
		return PR_TC_ACT_SHOT;
	}
	count(PR_ST_REDIR);
	return bpf_redirect_peer(port->ifindex, 0);
}
