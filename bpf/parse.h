/* Ethernet, IPv4, IPv6 (with extension headers) and L4 ports, the flow key and the flow hash:
 * the one parser every peregrine program uses. Built on pkt.h (direct, bounds-checked reads).
 *
 * Usage (a frame whose Ethernet header is at off; 0 VLAN tags allowed):
 *     struct prg_hdrs h = {};
 *     int r = prg_parse_frame(&p, off, 0, &h);   // PRG_OK, PRG_NO, PRG_NOTIP or PRG_SHORT
 *     __u32 fh = prg_flow_hash(&h.flow);
 * Step by step: prg_parse_eth -> prg_parse_ip (prg_parse_ipv4 / prg_parse_ipv6) -> prg_parse_ports.
 *
 * Rules every program shares (the Go model in internal/datapath/flow mirrors them):
 *  - IPv4: version 4, ihl >= 5, the header (options included) present, tot_len >= ihl * 4.
 *  - IPv6: hop-by-hop, routing, destination options and fragment headers are walked, at most
 *    PRG_IPV6_MAX_EXT of them; a longer chain is PRG_NO (the normal path takes it).
 *  - A fragment (IPv4 MF or offset, any IPv6 fragment header) sets frag and leaves the ports 0:
 *    only a first fragment carries them, and every fragment of a datagram must share one key.
 *  - Ports are read for TCP, UDP and SCTP (all start with sport, dport).
 */
#ifndef PEREGRINE_PARSE_H
#define PEREGRINE_PARSE_H

#include "pkt.h"
#include "rps.h"
#include <bpf/bpf_endian.h>

#define PRG_NOTIP (-3) /* a well-formed frame that is not IPv4/IPv6 (ARP...): a kind of PRG_NO */

#define PRG_ETH_P_IP 0x0800
#define PRG_ETH_P_IPV6 0x86DD
#define PRG_ETH_P_8021Q 0x8100
#define PRG_ETH_P_8021AD 0x88A8

#define PRG_IPPROTO_HOPOPTS 0
#define PRG_IPPROTO_TCP 6
#define PRG_IPPROTO_UDP 17
#define PRG_IPPROTO_ROUTING 43
#define PRG_IPPROTO_FRAGMENT 44
#define PRG_IPPROTO_DSTOPTS 60
#define PRG_IPPROTO_SCTP 132

#define PRG_IPV6_MAX_EXT 4

/* A flow: the key of every per-flow map. Addresses are the 32-bit words as loaded from the
 * packet (IPv4 in saddr[0]); ports in network order exactly as on the wire, 0 when absent. */
struct prg_flow {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* What prg_parse_frame found. */
struct prg_hdrs {
	struct prg_flow flow;
	__u32 l3_off;    /* IP header */
	__u32 l4_off;    /* L4 header (after the IPv6 extension headers) */
	__u16 eth_proto; /* host order, after VLAN tags */
	__u8 family;     /* 4 or 6 */
	__u8 dscp;
	__u8 ttl;        /* IPv4 TTL or IPv6 hop limit */
	__u8 frag;       /* an IP fragment: ports stay 0 */
	__u8 has_ports;
	__u8 pad;
};

/* prg_parse_eth reads the Ethernet header at off and up to max_vlans (a constant, 0..2) VLAN
 * tags: h->eth_proto, h->l3_off. A tag beyond max_vlans is PRG_NOTIP. */
static __always_inline int prg_parse_eth(const struct prg_pkt *p, __u32 off, int max_vlans,
					 struct prg_hdrs *h)
{
	struct ethhdr *eth = prg_hdr(p, off, struct ethhdr);
	if (!eth)
		return PRG_SHORT;
	__u16 proto = bpf_ntohs(eth->h_proto);
	off += sizeof(*eth);
#pragma unroll
	for (int i = 0; i < max_vlans; i++) {
		if (proto != PRG_ETH_P_8021Q && proto != PRG_ETH_P_8021AD)
			break;
		struct vlan_hdr *vh = prg_hdr(p, off, struct vlan_hdr);
		if (!vh)
			return PRG_SHORT;
		proto = bpf_ntohs(vh->h_vlan_encapsulated_proto);
		off += sizeof(*vh);
	}
	h->eth_proto = proto;
	h->l3_off = off;
	return PRG_OK;
}

static __always_inline int prg_parse_ipv4(const struct prg_pkt *p, struct prg_hdrs *h)
{
	__u32 off = h->l3_off;
	struct iphdr *ip = prg_hdr(p, off, struct iphdr);
	if (!ip)
		return PRG_SHORT;
	if (ip->version != 4 || ip->ihl < 5)
		return PRG_NO;
	__u32 hl = ip->ihl * 4;
	if (bpf_ntohs(ip->tot_len) < hl)
		return PRG_NO;
	if (!prg_at(p, off, hl))
		return PRG_SHORT;
	h->family = 4;
	h->flow.saddr[0] = ip->saddr;
	h->flow.daddr[0] = ip->daddr;
	h->flow.proto = ip->protocol;
	h->dscp = ip->tos >> 2;
	h->ttl = ip->ttl;
	h->frag = (ip->frag_off & bpf_htons(0x3fff)) != 0;
	h->l4_off = off + hl;
	return PRG_OK;
}

static __always_inline int prg_ipv6_is_ext(__u8 nh)
{
	return nh == PRG_IPPROTO_HOPOPTS || nh == PRG_IPPROTO_ROUTING || nh == PRG_IPPROTO_DSTOPTS ||
	       nh == PRG_IPPROTO_FRAGMENT;
}

static __always_inline int prg_parse_ipv6(const struct prg_pkt *p, struct prg_hdrs *h)
{
	__u32 off = h->l3_off;
	struct ipv6hdr *ip6 = prg_hdr(p, off, struct ipv6hdr);
	if (!ip6)
		return PRG_SHORT;
	if (ip6->version != 6)
		return PRG_NO;
	h->family = 6;
	__builtin_memcpy(h->flow.saddr, &ip6->saddr, 16);
	__builtin_memcpy(h->flow.daddr, &ip6->daddr, 16);
	h->dscp = ((ip6->priority << 4) | (ip6->flow_lbl[0] >> 4)) >> 2;
	h->ttl = ip6->hop_limit;
	__u8 nh = ip6->nexthdr;
	off += sizeof(*ip6);
	/* Hop-by-hop, routing and destination options: (hdrlen + 1) * 8 bytes; a fragment header
	 * is 8 bytes and ends the walk (the rest of the chain is in the first fragment only). */
#pragma unroll
	for (int i = 0; i < PRG_IPV6_MAX_EXT; i++) {
		if (!prg_ipv6_is_ext(nh))
			break;
		__u8 *ext = prg_at(p, off, 2);
		if (!ext)
			return PRG_SHORT;
		if (nh == PRG_IPPROTO_FRAGMENT) {
			h->frag = 1;
			nh = ext[0];
			off += 8;
			break;
		}
		nh = ext[0];
		off += (ext[1] + 1) * 8;
	}
	if (!h->frag && prg_ipv6_is_ext(nh))
		return PRG_NO; /* a longer chain than we walk */
	h->flow.proto = nh;
	h->l4_off = off;
	return PRG_OK;
}

/* prg_parse_ip parses the IP header at h->l3_off (h->eth_proto says which). */
static __always_inline int prg_parse_ip(const struct prg_pkt *p, struct prg_hdrs *h)
{
	if (h->eth_proto == PRG_ETH_P_IP)
		return prg_parse_ipv4(p, h);
	if (h->eth_proto == PRG_ETH_P_IPV6)
		return prg_parse_ipv6(p, h);
	return PRG_NOTIP;
}

static __always_inline int prg_has_ports(__u8 proto)
{
	return proto == PRG_IPPROTO_TCP || proto == PRG_IPPROTO_UDP || proto == PRG_IPPROTO_SCTP;
}

/* prg_parse_ports reads the ports of a TCP, UDP or SCTP packet that is not a fragment. */
static __always_inline int prg_parse_ports(const struct prg_pkt *p, struct prg_hdrs *h)
{
	if (h->frag || !prg_has_ports(h->flow.proto))
		return PRG_OK;
	__u16 *ports = prg_at(p, h->l4_off, 4);
	if (!ports)
		return PRG_SHORT;
	h->flow.sport = ports[0];
	h->flow.dport = ports[1];
	h->has_ports = 1;
	return PRG_OK;
}

/* prg_parse_frame parses the Ethernet frame at off down to the ports. */
static __always_inline int prg_parse_frame(const struct prg_pkt *p, __u32 off, int max_vlans,
					   struct prg_hdrs *h)
{
	int r = prg_parse_eth(p, off, max_vlans, h);
	if (r == PRG_OK)
		r = prg_parse_ip(p, h);
	if (r == PRG_OK)
		r = prg_parse_ports(p, h);
	return r;
}

/* prg_flow_hash is the flow hash of every program: murmur3's finaliser over the key's words
 * (the ports as the one word they make in memory). datapath.FlowHash mirrors it. */
static __always_inline __u32 prg_flow_hash(const struct prg_flow *f)
{
	__u32 h = 0x9e3779b9;
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = prg_fmix32(h ^ f->saddr[i]);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = prg_fmix32(h ^ f->daddr[i]);
	h = prg_fmix32(h ^ ((__u32)f->sport | ((__u32)f->dport << 16)));
	return prg_fmix32(h ^ f->proto);
}

#endif
