/* RPS hash steering, shared by the programs that choose the CPU of the next receive stage by
 * writing skb->hash (falcon, prism's HP isolation). Mirrored in Go by internal/datapath/rpshash.go.
 *
 * RPS picks map->cpus[reciprocal_scale(skb->hash, map->len)] (get_rps_cpu), with map->cpus the
 * device's rps_cpus mask in ascending CPU order, once the device has rps_flow_cnt 0 (RFS off).
 * bpf_set_hash marks the hash as an L4 software hash, which survives the VXLAN decapsulation
 * (iptunnel_pull_header clears only non-L4 hashes): a hash written at the underlay's ingress
 * decides the VXLAN device's RPS after its gro_cell. */
#ifndef PEREGRINE_RPS_H
#define PEREGRINE_RPS_H

/* murmur3's finaliser: a full avalanche, so "% n" of small CPU sets reads well-mixed bits. */
static __always_inline __u32 prg_fmix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* A hash RPS maps to index idx of an n-entry map: reciprocal_scale(h, n) = (h * n) >> 32 = idx
 * for every h in [ceil(idx * 2^32 / n), ceil((idx + 1) * 2^32 / n)). The flow hash fh picks a
 * point in that range, so the skb keeps a flow-specific hash; 0 ("no hash") is avoided. The
 * caller keeps idx < n and n >= 1. */
static __always_inline __u32 prg_rps_hash(__u32 idx, __u32 n, __u32 fh)
{
	__u64 lo = (((__u64)idx << 32) + n - 1) / n;
	__u64 hi = (((__u64)(idx + 1) << 32) + n - 1) / n;
	__u64 h = lo + (__u64)fh % (hi - lo);
	return h ? (__u32)h : 1;
}

#endif
