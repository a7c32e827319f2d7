/* ezpath.h: what EZPath's switch (ezpath_tor.bpf.c) and host (ezpath_host.bpf.c) programs share:
 * tc verdicts, the 802.1Q tag of a frame (hardware-accelerated or in the data) and the per-CPU
 * counter helper. The Go side (internal/datapath/ezpath) mirrors the structs of both files. */
#ifndef PEREGRINE_EZPATH_H
#define PEREGRINE_EZPATH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parse.h"

#define EZP_TCX_NEXT (-1)
#define EZP_TC_ACT_SHOT 2
#define EZP_VID_MASK 0x0fff

/* ezp_vid returns the frame's VLAN ID, or -1 when it carries no 802.1Q tag. On a device's
 * receive path the kernel has moved an in-band tag into skb->vlan_tci before tc runs; a frame
 * from BPF_PROG_TEST_RUN (or a stack without that untagging) still has it in the data. */
static __always_inline int ezp_vid(struct __sk_buff *ctx, const struct prg_pkt *p)
{
	if (ctx->vlan_present)
		return ctx->vlan_tci & EZP_VID_MASK;
	struct ethhdr *eth = prg_hdr(p, 0, struct ethhdr);
	if (!eth || eth->h_proto != bpf_htons(PRG_ETH_P_8021Q))
		return -1;
	struct vlan_hdr *vh = prg_hdr(p, sizeof(*eth), struct vlan_hdr);
	if (!vh)
		return -1;
	return bpf_ntohs(vh->h_vlan_TCI) & EZP_VID_MASK;
}

/* ezp_count adds one to counter i of a per-CPU array of __u64. */
static __always_inline void ezp_count(void *stats, __u32 i)
{
	__u64 *c = bpf_map_lookup_elem(stats, &i);
	if (c)
		*c += 1;
}

#endif
