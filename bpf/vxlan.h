/* The outer VXLAN parse: Ethernet / IPv4 or IPv6 / UDP to a VXLAN port / VXLAN header, on the
 * underlay (before decapsulation). Built on parse.h.
 *
 * Usage:
 *     struct prg_vxlan vx;
 *     if (prg_vxlan_outer(&p, cfg->vxlan_ports, &vx) == PRG_OK)
 *         ... inner Ethernet frame at vx.inner, VNI vx.vni ...
 * A frame is VXLAN when it is not an IP fragment, its UDP destination port is in the port set
 * (PRG_VXLAN_MAX_PORTS entries, host order, 0 = unused; the set is recorded once at discovery,
 * datapath.Topology.VXLANPorts) and its VXLAN header has the I flag (a valid VNI) set.
 */
#ifndef PEREGRINE_VXLAN_H
#define PEREGRINE_VXLAN_H

#include "parse.h"

#define PRG_VXLAN_MAX_PORTS 8
#define PRG_VXLAN_HLEN 8
#define PRG_VXLAN_FLAG_I 0x08 /* first byte of the header: the VNI is valid */

struct prg_vxlan {
	__u32 inner; /* offset of the inner Ethernet header */
	__u32 vni;
};

static __always_inline int prg_vxlan_port_ok(const __u16 *ports, __u16 dport)
{
#pragma unroll
	for (int i = 0; i < PRG_VXLAN_MAX_PORTS; i++)
		if (ports[i] && ports[i] == dport)
			return 1;
	return 0;
}

/* prg_vxlan_of checks that the parsed outer headers h are VXLAN and fills vx. PRG_NO: they are
 * not (other traffic, a fragment, a VXLAN header without the I flag). */
static __always_inline int prg_vxlan_of(const struct prg_pkt *p, const struct prg_hdrs *h,
					const __u16 *ports, struct prg_vxlan *vx)
{
	if (!h->has_ports || h->flow.proto != PRG_IPPROTO_UDP ||
	    !prg_vxlan_port_ok(ports, bpf_ntohs(h->flow.dport)))
		return PRG_NO;
	__u32 off = h->l4_off + sizeof(struct udphdr);
	__u32 *hdr = prg_at(p, off, PRG_VXLAN_HLEN); /* flags(8) reserved(24) | VNI(24) reserved(8) */
	if (!hdr)
		return PRG_SHORT;
	if (!(((__u8 *)hdr)[0] & PRG_VXLAN_FLAG_I))
		return PRG_NO;
	vx->vni = bpf_ntohl(hdr[1]) >> 8;
	vx->inner = off + PRG_VXLAN_HLEN;
	return PRG_OK;
}

/* prg_vxlan_outer parses the outer headers of the frame at offset 0 (no VLAN tag: on tc the
 * kernel has taken it off already). */
static __always_inline int prg_vxlan_outer(const struct prg_pkt *p, const __u16 *ports,
					   struct prg_vxlan *vx)
{
	struct prg_hdrs h = {};
	int r = prg_parse_frame(p, 0, 0, &h);
	if (r == PRG_NOTIP)
		return PRG_NO;
	if (r != PRG_OK)
		return r;
	return prg_vxlan_of(p, &h, ports, vx);
}

#endif
