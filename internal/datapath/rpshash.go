package datapath

// RPS hash steering: a tc program writes skb->hash with bpf_set_hash so that the next device's
// RPS lands the packet on a chosen CPU. These mirror bpf/rps.h (falcon and prism's HP isolation
// use both); tests compare the programs' choices with them.

// ReciprocalScale is the kernel's reciprocal_scale(): how RPS turns a hash into an index of a
// device's RPS map (its rps_cpus in ascending CPU order).
func ReciprocalScale(hash uint32, n uint32) uint32 { return uint32(uint64(hash) * uint64(n) >> 32) }

// RPSHash is prg_rps_hash(): a non-zero hash that RPS maps to index idx of an n-CPU map, chosen
// within the index's range by the flow hash (so the skb keeps a flow-specific hash).
func RPSHash(idx, n, flowHash uint32) uint32 {
	lo := (uint64(idx)<<32 + uint64(n) - 1) / uint64(n)
	hi := (uint64(idx+1)<<32 + uint64(n) - 1) / uint64(n)
	h := lo + uint64(flowHash)%(hi-lo)
	if h == 0 {
		return 1
	}
	return uint32(h)
}

// RPSIndex is the position of cpu in an RPS map built from cpus (any order): RPS orders its map
// by CPU id. -1 if cpu is not in the set.
func RPSIndex(cpus []int, cpu int) int {
	idx, found := 0, false
	for _, c := range cpus {
		if c < cpu {
			idx++
		}
		found = found || c == cpu
	}
	if !found {
		return -1
	}
	return idx
}
