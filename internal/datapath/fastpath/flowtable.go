package fastpath

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The flow table (prg_fastpath_flow) is a preallocated hash sized at attach from the node's
// memory, shared fairly: each local address (a pod, or the node's own) may hold at most a budget
// of entries, so a pod that floods new flows fills its own share and never evicts another pod's
// flows (an LRU would). Entries expire by an eBPF timer that sweeps the table in the kernel once a
// second (bpf/fastpath.h, sweep_one), and forgetting every flow is a generation change, so neither the agent nor status walks the
// table: their cost does not grow with it.

const (
	flowEntryBytes = 320     // an entry's kernel memory: key, value, hash element, per-CPU free list
	flowMemShare   = 1024    // the table takes at most 1/flowMemShare of the node's memory
	minFlows       = 16384   // floor, also for small nodes
	maxFlows       = 1 << 20 // ceiling
	minBudgetPods  = 4       // the budget divides the table among at least this many addresses
)

// flowTableSize is how many flows the table holds on a node with memTotal bytes of memory:
// 1/1024 of it at ~320 bytes an entry (24 GiB: 78 643), within [16 384, 1 048 576].
func flowTableSize(memTotal uint64) uint32 {
	n := memTotal / flowMemShare / flowEntryBytes
	return uint32(min(max(n, minFlows), maxFlows))
}

// flowBudget is how many flows one local address may hold in a table of size entries on a node
// with pods live pods: an equal share, one more share for the node's own addresses.
func flowBudget(size uint32, pods int) uint32 {
	return size / uint32(max(pods+1, minBudgetPods))
}

// memTotal reads MemTotal from /proc/meminfo, in bytes.
func memTotal() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) >= 2 && fs[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(fs[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("meminfo: %w", err)
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("meminfo: no MemTotal")
}

// flowTables are the flow tables sized from the node's memory: the IPv4 one and the IPv6 one
// (bpf/fastpath6.h). Both get the same number of entries, so the per-address budget (taken from
// the IPv4 table's size, flowBudget) fits either; an IPv6 entry is a little larger (40-byte
// key), so the two together take a little over 2/flowMemShare of the node's memory. The IPv6
// Service NAT side table (prg_fastpath_nat6, bpf/fastpath_nat6.h) holds at most an entry per
// IPv6 entry, so it gets the same size; it is not preallocated (only Service flows and their
// aliases take memory).
var flowTables = []string{"prg_fastpath_flow", "prg_fastpath_flow6", "prg_fastpath_nat6"}

// sizeFlowTable sets the flow tables' size in spec from this node's memory.
func sizeFlowTable(spec *ebpf.CollectionSpec) error {
	mem, err := memTotal()
	if err != nil {
		return fmt.Errorf("fastpath: size the flow table: %w", err)
	}
	for _, name := range flowTables {
		m, ok := spec.Maps[name]
		if !ok {
			return fmt.Errorf("fastpath: the objects have no %s", name)
		}
		m.MaxEntries = flowTableSize(mem)
	}
	return nil
}

// keepFlowSizes makes spec's flow tables the size of m's (sized at attach, sizeFlowTable), so
// that programs loaded from spec can take m's maps as replacements (an overlay's copy of the
// programs, an upgrade in place).
func keepFlowSizes(spec *ebpf.CollectionSpec, m *fpMaps) {
	for name, mp := range map[string]*ebpf.Map{"prg_fastpath_flow": m.PrgFastpathFlow, "prg_fastpath_flow6": m.PrgFastpathFlow6,
		"prg_fastpath_nat6": m.PrgFastpathNat6} {
		if fm := spec.Maps[name]; fm != nil && mp != nil {
			fm.MaxEntries = mp.MaxEntries()
		}
	}
}

var genMu sync.Mutex
var lastGen uint32

// nextGen is a flow generation no flow of this node has: writing it into an overlay's config
// forgets every flow of that overlay at once (the programs treat another generation's entries as
// unlearned and reset them on their next packet). Seeded from the clock, so an agent that
// restarts does not reuse its predecessor's.
func nextGen() uint32 {
	genMu.Lock()
	defer genMu.Unlock()
	g := uint32(time.Now().UnixNano() >> 20)
	if g <= lastGen {
		g = lastGen + 1
	}
	lastGen = g
	return g
}

// cfgWith is the overlay's config with a new generation and the flow budget.
func cfgWith(ov *overlay, budget uint32) fpFpCfg {
	c := ov.cfg()
	c.Gen = nextGen()
	c.Budget = budget
	return c
}

// Entry flags of the table's lifecycle (bpf/fastpath.h).
const (
	fClosing = 128 // TCP FIN or RST seen: the entry goes 2 s later
	fCounted = 256 // counted in prg_fastpath_pcnt
	fFinOut  = 512 // TCP: the local pod's FIN went through conntrack (a RST sets both)
	fFinIn   = 1024
	fDone    = fFinOut | fFinIn // both FINs: only their ACKs can follow
	fHsOnly  = 2048             // TCP: learned from its handshake only: its FIN/RST ride the fast path
)

// flowCounts sums the per-address flow counters (prg_fastpath_pcnt): the flows of each overlay
// and the largest share one address holds, without walking the flow table.
func (p *pinned) flowCounts() (perOvl map[int]int, top map[int]int, err error) {
	perOvl, top = map[int]int{}, map[int]int{}
	var k uint64
	var n uint32
	it := p.PrgFastpathPcnt.Iterate()
	for it.Next(&k, &n) {
		o, _, _ := pcntKey(k)
		perOvl[o] += int(n)
		top[o] = max(top[o], int(n))
	}
	return perOvl, top, it.Err()
}

// learnedSample walks at most limit entries of the flow table and says how many of them (not
// aliases) were learned both ways, of how many: status shows the share, at a bounded cost.
func (p *pinned) learnedSample(limit int) (both, seen map[int]int, err error) {
	both, seen = map[int]int{}, map[int]int{}
	gens := map[int]uint32{} // an entry of another generation is forgotten (cfgWith)
	for i := range maxOverlays {
		var c fpFpCfg
		if p.PrgFastpathCfg.Lookup(uint32(i), &c) == nil {
			gens[i] = c.Gen
		}
	}
	var k fpFpKey
	var f fpFpFlow
	it := p.PrgFastpathFlow.Iterate()
	for i := 0; i < limit && it.Next(&k, &f); i++ {
		if f.Flags&fAlias != 0 {
			continue
		}
		seen[int(k.Ovl)]++
		if f.Flags&(fOut|fIn) == fOut|fIn && f.Gen == gens[int(k.Ovl)] {
			both[int(k.Ovl)]++
		}
	}
	return both, seen, it.Err()
}

// forgetCounts drops the per-address counters the drop function selects (by overlay and, for
// IPv4, local address), after their flows were deleted by a walk (the timers that would have
// counted them down went with the entries). An IPv6 address's counter (its key's low word is a
// fold of the address, not an address) is passed with ipv4 false; forget6 counts those down
// entry by entry, so only an overlay's end drops them.
func (p *pinned) forgetCounts(drop func(ovl int, local uint32, ipv4 bool) bool) {
	var k uint64
	var n uint32
	var del []uint64
	it := p.PrgFastpathPcnt.Iterate()
	for it.Next(&k, &n) {
		ovl, local, ipv4 := pcntKey(k)
		if drop(ovl, local, ipv4) {
			del = append(del, k)
		}
	}
	for _, k := range del {
		_ = p.PrgFastpathPcnt.Delete(k)
	}
}

// fpPcnt6 is bpf/fastpath6.h's FP_PCNT6: the bit that marks an IPv6 address's counter key.
const fpPcnt6 = uint64(1) << 48

// pcntKey splits a flow counter's key (pcnt_key / pcnt6_key in the programs): the overlay index,
// the low word (an IPv4 address, or an IPv6 address's fold) and whether it is IPv4's.
func pcntKey(k uint64) (ovl int, local uint32, ipv4 bool) {
	return int(k>>32) & 0xffff, uint32(k), k&fpPcnt6 == 0
}

// monoNs is the programs' clock (bpf_ktime_get_coarse_ns: CLOCK_MONOTONIC, coarse).
func monoNs() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return uint64(ts.Nano())
}
