/* pod.h: hand a frame straight to a local pod (container) with bpf_redirect_peer, through an
 * endpoint table that can never misdeliver. Shared by the fast path and EZPath's host side; the
 * Go side that fills the tables is internal/datapath/endpoints.
 *
 * A program declares its own pair of tables with PRG_POD_MAPS (names prg_<mode>_...):
 *   EP:   pod address -> endpoint (bridge-side veth ifindex, MACs, devmap slot), kept by userspace
 *   PORT: DEVMAP_HASH slot -> the veth. The kernel removes a devmap entry when its device is
 *         unregistered, so a vanished pod (or an ifindex reused by another device) finds no slot
 *         or a different ifindex, and prg_pod_lookup4 says STALE instead of redirecting.
 * Userspace writes a changed endpoint to a fresh slot before pointing the entry at it.
 */
#ifndef PEREGRINE_POD_H
#define PEREGRINE_POD_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct prg_pod_key {
	__u32 netns;  /* domain: netns inode of the bridge-side veths (overlays may reuse addresses) */
	__u32 family; /* 4 or 6 */
	__u32 addr[4]; /* network order; IPv4 in addr[0] */
};

struct prg_pod {
	__u32 slot;      /* key of the veth in the PORT devmap */
	__u32 ifindex;   /* bridge-side (host-side) veth, in the domain's namespace */
	__u8 ctr_mac[6]; /* the pod's eth0 */
	__u8 br_mac[6];  /* the bridge the veth is enslaved to (a routed overlay's source MAC) */
	__u32 flags;     /* PRG_POD_F_* */
	__u64 gone_ns;   /* userspace's clock when it marked the endpoint gone (expiry) */
};

#define PRG_POD_F_GONE 1 /* the pod vanished (a tombstone userspace keeps for a while) */

#define PRG_POD_MAPS(EP, PORT, N)                                   \
	struct {                                                    \
		__uint(type, BPF_MAP_TYPE_HASH);                    \
		__uint(max_entries, N);                             \
		__type(key, struct prg_pod_key);                    \
		__type(value, struct prg_pod);                      \
	} EP SEC(".maps");                                          \
	struct {                                                    \
		__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);             \
		__uint(max_entries, N);                             \
		__type(key, __u32);                                 \
		__type(value, struct bpf_devmap_val);               \
	} PORT SEC(".maps")

/* Results of prg_pod_lookup4. */
#define PRG_POD_OK 0
#define PRG_POD_MISS 1  /* no such pod here: not ours to deliver */
#define PRG_POD_GONE 2  /* userspace saw it vanish */
#define PRG_POD_STALE 3 /* its veth is no longer the device userspace recorded */

/* prg_pod_lookup4 finds the live endpoint of IPv4 address addr in domain netns. */
static __always_inline int prg_pod_lookup4(void *ep_map, void *port_map, __u32 netns, __u32 addr,
					   struct prg_pod **out)
{
	struct prg_pod_key k = {.netns = netns, .family = 4, .addr = {addr}};
	struct prg_pod *p = bpf_map_lookup_elem(ep_map, &k);
	if (!p)
		return PRG_POD_MISS;
	if (p->flags & PRG_POD_F_GONE)
		return PRG_POD_GONE;
	__u32 slot = p->slot;
	struct bpf_devmap_val *v = bpf_map_lookup_elem(port_map, &slot);
	if (!v || v->ifindex != p->ifindex)
		return PRG_POD_STALE;
	*out = p;
	return PRG_POD_OK;
}

/* prg_pod_deliver writes the frame's MACs as the pod's own veth would receive them, marks it
 * for this host (redirect_peer keeps the pkt_type the arriving device gave it, and ip_rcv drops
 * PACKET_OTHERHOST; 6.15+ scrubs it anyway) and redirects it into the pod's namespace. Only
 * valid at tc ingress. Returns the tc verdict, or -1 (nothing redirected) if a rewrite failed. */
static __always_inline long prg_pod_deliver(struct __sk_buff *ctx, const __u8 *dmac, const __u8 *smac,
					    __u32 ifindex)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;

	if (data + 12 > end) {
		if (bpf_skb_pull_data(ctx, 12))
			return -1;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + 12 > end)
			return -1;
	}
	__builtin_memcpy(data, dmac, 6); /* in place: no helper call per frame */
	__builtin_memcpy(data + 6, smac, 6);
	if (bpf_skb_change_type(ctx, 0 /* PACKET_HOST */))
		return -1;
	return bpf_redirect_peer(ifindex, 0);
}

#endif
