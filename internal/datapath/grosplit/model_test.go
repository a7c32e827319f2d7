package grosplit

import (
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
)

// The Go model of prg_grosplit's CPU choice: the shared parser model (internal/datapath/flow)
// plus gs_flow_of and the slot math. The tests compare the kernel's choice with this one, so a
// change on either side that breaks flow affinity or the VXLAN rule shows up as a mismatch.

func slotOf(h uint32, n int) int { return int((uint64(h) * uint64(n)) >> 32) }

// modelFlow is gs_flow_of: the key prg_grosplit hashes, whether it is the inner (VXLAN) one,
// and ok=false where the program passes the frame.
func modelFlow(b []byte, vxlanPorts []uint16) (f flow.Key, vx, ok bool) {
	out, r := flow.ParseFrame(b, 0, 2)
	if r != flow.OK {
		return f, false, false
	}
	inner, _, r := flow.VXLANOf(b, out, vxlanPorts)
	if r != flow.OK {
		return out.Key, false, true
	}
	in, r := flow.ParseFrame(b, inner, 2)
	switch r {
	case flow.OK:
		return in.Key, true, true
	case flow.NotIP:
		return out.Key, false, true // inner ARP and the like: the outer tuple
	}
	return f, false, false
}

// modelChoice is the slot (index into the CPU list) flow affinity picks, ok=false for a pass.
func modelChoice(b []byte, n int, vxlanPorts []uint16) (slot int, hash uint32, vx, ok bool) {
	f, vx, ok := modelFlow(b, vxlanPorts)
	if !ok || n == 0 {
		return 0, 0, false, false
	}
	h := f.Hash()
	return slotOf(h, n), h, vx, true
}
