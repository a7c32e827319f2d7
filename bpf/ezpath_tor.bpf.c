// SPDX-License-Identifier: GPL-2.0
/*
 * EZPath's top-of-rack switch data plane (docs/modes/ezpath.md; the P4 contract is docs/ezpath_tor.p4).
 *
 * The paper's ToR is a Tofino running P4; here it is a namespace whose ports run these tc
 * programs, with maps named after the reconstructed P4 tables and max_entries standing in for
 * the switch's SRAM. docs/ezpath_tor.p4 is the same pipeline written as P4_16 (the contract);
 * this file is the tested data plane.
 *
 *   prg_ezp_tor_dn    tcx ingress of the host-facing port ("down"):
 *       802.1Q-tagged frame (an offloaded flow: the host only tagged it)
 *         ezp_vlan_to_vni[port, VID] -> VNI            (miss: unknown tenant, drop)
 *         ezp_encap[VNI, inner dst]  -> remote VTEP    (miss: drop; the host tags only what the
 *                                                       controller installed here first)
 *         ezp_ipv4_lpm[remote VTEP]  -> port, MACs     (the underlay route)
 *         pop the tag, push outer Ethernet/IPv4/UDP/VXLAN, redirect to the port.
 *       untagged VXLAN from the host's own VTEP (the overlay, not offloaded): counted per flow
 *         in ezp_flow_bytes and left to the kernel, which routes it as plain IP.
 *       anything else: left to the kernel.
 *   prg_ezp_tor_up    tcx ingress of the underlay port ("up"):
 *       VXLAN to this ToR's VTEP with a known ezp_decap[VTEP, VNI, inner dst] -> port, VID:
 *         strip the outer headers, push the tag, redirect to the host port.
 *       VXLAN to this VTEP with an unknown key: dropped (nobody else could take it).
 *       anything else (host-VTEP VXLAN, other IP): left to the kernel.
 *
 * ezp_flow_bytes counts every overlay flow entering the rack's switch from its host, offloaded
 * (tagged) or not (VXLAN), keyed by (VNI, inner 5-tuple): the register the controller polls.
 */
#include "ezpath.h"
#include "vxlan.h"

char LICENSE[] SEC("license") = "GPL";

#define EZP_ENCAP_LEN 50 /* outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14 */
/* uapi's BPF_F_ADJ_ROOM_ENCAP_L2(len) is a macro, so vmlinux.h lacks it. */
#define EZP_ADJ_ROOM_ENCAP_L2(len) (((__u64)(len) & 0xff) << 56)
#define EZP_DEFAULT_TABLE 1024 /* attach --table-size rewrites max_entries */

/* Counters (prg_ezp_tstat index); keep in step with tor.go. */
enum {
	EZT_ENCAP,       /* tagged frames encapsulated and sent to a remote VTEP */
	EZT_DECAP,       /* VXLAN frames to our VTEP decapsulated and tagged to a host */
	EZT_TRANSIT,     /* untagged overlay VXLAN frames counted and routed as plain IP */
	EZT_MISS_VNI,    /* tagged, but (port, VID) is no tenant: dropped */
	EZT_MISS_ENCAP,  /* tagged, but (VNI, dst) not offloaded here: dropped */
	EZT_MISS_ROUTE,  /* no underlay route to the remote VTEP: dropped */
	EZT_MISS_DECAP,  /* VXLAN to our VTEP with an unknown (VNI, dst): dropped */
	EZT_NOT_IP,      /* tagged frame that is not IPv4: dropped */
	EZT_ERR,         /* a helper failed (adjust_room, store, vlan push/pop): dropped */
	EZT_N,
};

struct ezp_tor_cfg {
	__u32 vtep;          /* this ToR's VTEP address, network order */
	__u16 vxlan_ports[PRG_VXLAN_MAX_PORTS]; /* host order; the overlay's VXLAN port first */
};

struct ezp_port_vid {
	__u32 ifindex; /* the ToR port the frame came in on */
	__u32 vid;
};

struct ezp_encap_key {
	__u32 vni;
	__u32 dst; /* inner IPv4 destination, network order */
};

struct ezp_encap_val {
	__u32 remote_vtep; /* a remote ToR's VTEP, or a remote host's when only this side offloads */
	__u32 vni;         /* VNI on the wire (the tenant's) */
};

struct ezp_decap_key {
	__u32 vtep; /* our own VTEP (outer destination) */
	__u32 vni;
	__u32 dst;  /* inner IPv4 destination */
};

struct ezp_decap_val {
	__u32 ifindex; /* host port */
	__u32 vid;     /* the tenant's VID on that host link */
};

struct ezp_lpm_key {
	__u32 prefixlen;
	__u32 addr; /* network order */
};

struct ezp_nexthop {
	__u32 ifindex;
	__u8 smac[6];
	__u8 dmac[6];
};

struct ezp_flow_key {
	__u32 vni;
	struct prg_flow flow;
};

struct ezp_flow_val {
	__u64 bytes;
	__u64 packets;
	__u64 last_ns;
	__u64 offloaded_packets; /* of packets: those that came tagged (on the switch path) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ezp_tor_cfg);
} ezp_tor_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ezp_port_vid);
	__type(value, __u32);
} ezp_vlan_to_vni SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EZP_DEFAULT_TABLE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ezp_encap_key);
	__type(value, struct ezp_encap_val);
} ezp_encap SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EZP_DEFAULT_TABLE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ezp_decap_key);
	__type(value, struct ezp_decap_val);
} ezp_decap SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ezp_lpm_key);
	__type(value, struct ezp_nexthop);
} ezp_ipv4_lpm SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ezp_flow_key);
	__type(value, struct ezp_flow_val);
} ezp_flow_bytes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZT_N);
	__type(key, __u32);
	__type(value, __u64);
} prg_ezp_tstat SEC(".maps");

static __always_inline struct ezp_tor_cfg *tor_cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&ezp_tor_cfg, &zero);
}

/* count_flow adds a frame of len bytes to its flow's register. */
static __always_inline void count_flow(__u32 vni, const struct prg_flow *f, __u32 len, int offloaded)
{
	struct ezp_flow_key k = {.vni = vni};
	__builtin_memcpy(&k.flow, f, sizeof(*f));
	__u64 now = bpf_ktime_get_ns();
	struct ezp_flow_val *v = bpf_map_lookup_elem(&ezp_flow_bytes, &k);
	if (!v) {
		struct ezp_flow_val nv = {.bytes = len, .packets = 1, .last_ns = now, .offloaded_packets = offloaded};
		bpf_map_update_elem(&ezp_flow_bytes, &k, &nv, BPF_NOEXIST);
		return;
	}
	__sync_fetch_and_add(&v->bytes, len);
	__sync_fetch_and_add(&v->packets, 1);
	if (offloaded)
		__sync_fetch_and_add(&v->offloaded_packets, 1);
	v->last_ns = now;
}

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The headers encapsulation writes at the front of the frame, in wire order. */
struct ezp_outer {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	__u8 vx_flags;
	__u8 vx_rsvd[3];
	__be32 vx_vni; /* VNI << 8 */
	__u8 inner_dst[6];
	__u8 inner_src[6];
	__be16 inner_proto;
} __attribute__((packed));

/* encap turns the untagged inner frame at offset 0 into a VXLAN frame from src to dst VTEP. */
static __always_inline int encap(struct __sk_buff *ctx, __u32 vni, __u32 src, __u32 dst,
				 const struct ezp_nexthop *nh, __u32 hash)
{
	struct ezp_outer o = {};
	if (bpf_skb_load_bytes(ctx, 0, o.inner_dst, 14))
		return -1;
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
		      BPF_F_ADJ_ROOM_ENCAP_L2_ETH | EZP_ADJ_ROOM_ENCAP_L2(14);
	if (bpf_skb_adjust_room(ctx, EZP_ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags))
		return -1;
	__u32 ip_len = ctx->len - sizeof(struct ethhdr);
	__builtin_memcpy(o.eth.h_dest, nh->dmac, 6);
	__builtin_memcpy(o.eth.h_source, nh->smac, 6);
	o.eth.h_proto = bpf_htons(PRG_ETH_P_IP);
	struct iphdr ip = {};
	ip.version = 4;
	ip.ihl = 5;
	ip.tot_len = bpf_htons(ip_len);
	ip.ttl = 64;
	ip.protocol = PRG_IPPROTO_UDP;
	ip.saddr = src;
	ip.daddr = dst;
	__u32 sum = 0;
	__u16 *w = (__u16 *)&ip;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	ip.check = csum_fold(sum);
	__builtin_memcpy(&o.ip, &ip, sizeof(ip));
	/* Source port from the inner flow's hash (as the kernel's udp_flow_src_port does), so the
	 * underlay's ECMP spreads offloaded flows; checksum 0, as VXLAN over IPv4 allows. */
	o.udp.source = bpf_htons(49152 | (hash & 0x3fff));
	struct ezp_tor_cfg *c = tor_cfg();
	o.udp.dest = bpf_htons(c ? c->vxlan_ports[0] : 4789);
	o.udp.len = bpf_htons(ip_len - sizeof(struct iphdr));
	o.vx_flags = PRG_VXLAN_FLAG_I;
	o.vx_vni = bpf_htonl(vni << 8);
	if (bpf_skb_store_bytes(ctx, 0, &o, sizeof(o), 0))
		return -1;
	return 0;
}

SEC("tcx/ingress")
int prg_ezp_tor_dn(struct __sk_buff *ctx)
{
	struct ezp_tor_cfg *cfg = tor_cfg();
	if (!cfg || !cfg->vtep)
		return EZP_TCX_NEXT;
	struct prg_pkt p;
	prg_pkt_tc(&p, ctx);
	int vid = ezp_vid(ctx, &p);
	if (vid < 0) {
		/* The overlay in transit: count the flow, let the kernel route it. */
		struct prg_vxlan vx;
		int r;
		PRG_TC_PARSE(r, &p, ctx, prg_vxlan_outer(&p, cfg->vxlan_ports, &vx));
		if (r != PRG_OK)
			return EZP_TCX_NEXT;
		struct prg_hdrs ih = {};
		PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, vx.inner, 0, &ih));
		if (r == PRG_OK) {
			count_flow(vx.vni, &ih.flow, ctx->len - vx.inner, 0);
			ezp_count(&prg_ezp_tstat, EZT_TRANSIT);
		}
		return EZP_TCX_NEXT;
	}
	struct ezp_port_vid pv = {.ifindex = ctx->ifindex, .vid = vid}; /* at ingress: the port */
	__u32 *vni = bpf_map_lookup_elem(&ezp_vlan_to_vni, &pv);
	if (!vni) {
		ezp_count(&prg_ezp_tstat, EZT_MISS_VNI);
		return EZP_TC_ACT_SHOT;
	}
	__u32 tenant = *vni;
	if (bpf_skb_vlan_pop(ctx)) {
		ezp_count(&prg_ezp_tstat, EZT_ERR);
		return EZP_TC_ACT_SHOT;
	}
	prg_pkt_tc(&p, ctx);
	struct prg_hdrs h = {};
	int r;
	PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, 0, 0, &h));
	if (r != PRG_OK || h.family != 4) {
		ezp_count(&prg_ezp_tstat, EZT_NOT_IP);
		return EZP_TC_ACT_SHOT;
	}
	struct ezp_encap_key ek = {.vni = tenant, .dst = h.flow.daddr[0]};
	struct ezp_encap_val *ev = bpf_map_lookup_elem(&ezp_encap, &ek);
	if (!ev) {
		ezp_count(&prg_ezp_tstat, EZT_MISS_ENCAP);
		return EZP_TC_ACT_SHOT;
	}
	count_flow(tenant, &h.flow, ctx->len, 1);
	struct ezp_lpm_key lk = {.prefixlen = 32, .addr = ev->remote_vtep};
	struct ezp_nexthop *nh = bpf_map_lookup_elem(&ezp_ipv4_lpm, &lk);
	if (!nh) {
		ezp_count(&prg_ezp_tstat, EZT_MISS_ROUTE);
		return EZP_TC_ACT_SHOT;
	}
	struct ezp_nexthop hop = *nh;
	if (encap(ctx, ev->vni, cfg->vtep, ev->remote_vtep, &hop, prg_flow_hash(&h.flow))) {
		ezp_count(&prg_ezp_tstat, EZT_ERR);
		return EZP_TC_ACT_SHOT;
	}
	ezp_count(&prg_ezp_tstat, EZT_ENCAP);
	return bpf_redirect(hop.ifindex, 0);
}

SEC("tcx/ingress")
int prg_ezp_tor_up(struct __sk_buff *ctx)
{
	struct ezp_tor_cfg *cfg = tor_cfg();
	if (!cfg || !cfg->vtep)
		return EZP_TCX_NEXT;
	struct prg_pkt p;
	prg_pkt_tc(&p, ctx);
	struct prg_hdrs oh = {};
	int r;
	PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, 0, 0, &oh));
	if (r != PRG_OK || oh.family != 4 || oh.flow.daddr[0] != cfg->vtep)
		return EZP_TCX_NEXT; /* not for this VTEP: routed by the kernel */
	struct prg_vxlan vx;
	if (prg_vxlan_of(&p, &oh, cfg->vxlan_ports, &vx) != PRG_OK)
		return EZP_TCX_NEXT;
	struct prg_hdrs ih = {};
	PRG_TC_PARSE(r, &p, ctx, prg_parse_frame(&p, vx.inner, 0, &ih));
	if (r != PRG_OK || ih.family != 4) {
		ezp_count(&prg_ezp_tstat, EZT_MISS_DECAP);
		return EZP_TC_ACT_SHOT;
	}
	struct ezp_decap_key dk = {.vtep = cfg->vtep, .vni = vx.vni, .dst = ih.flow.daddr[0]};
	struct ezp_decap_val *dv = bpf_map_lookup_elem(&ezp_decap, &dk);
	if (!dv) {
		ezp_count(&prg_ezp_tstat, EZT_MISS_DECAP);
		return EZP_TC_ACT_SHOT;
	}
	struct ezp_decap_val out = *dv;
	__u8 macs[12];
	/* The 50 bytes after the outer Ethernet header go: outer IPv4 (no options) to inner MACs. */
	if (vx.inner != EZP_ENCAP_LEN ||
	    bpf_skb_load_bytes(ctx, vx.inner, macs, sizeof(macs)) ||
	    bpf_skb_adjust_room(ctx, -EZP_ENCAP_LEN, BPF_ADJ_ROOM_MAC, 0) ||
	    bpf_skb_store_bytes(ctx, 0, macs, sizeof(macs), 0) ||
	    bpf_skb_vlan_push(ctx, bpf_htons(PRG_ETH_P_8021Q), out.vid)) {
		ezp_count(&prg_ezp_tstat, EZT_ERR);
		return EZP_TC_ACT_SHOT;
	}
	ezp_count(&prg_ezp_tstat, EZT_DECAP);
	return bpf_redirect(out.ifindex, 0);
}
