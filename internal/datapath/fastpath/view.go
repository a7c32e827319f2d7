package fastpath

import (
	"fmt"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
)

// Reasons, in the order of the program's counters (FP_R_* in bpf/fastpath.bpf.c).
var Reasons = []string{"hit", "miss", "stale", "not-ipv4", "l2", "ip-options", "fragment", "proto", "no-pod",
	"mtu", "ttl", "unsupported", "error", "dropped", "learned", "other", "nat", "local"}

// Direction is one direction's counters: packets per reason (Reasons).
type Direction map[string]uint64

// View is what `status` shows of the fast path on a node.
type View struct {
	Target    string           `json:"target"`
	Layout    string           `json:"layout"`
	VXLAN     string           `json:"vxlan"`
	Underlay  string           `json:"underlay"`
	Egress    Direction        `json:"egress"`  // packets leaving pods
	Ingress   Direction        `json:"ingress"` // packets arriving for pods
	SkipsOut  string           `json:"egress_skips"`
	SkipsIn   string           `json:"ingress_skips"`
	Flows     int              `json:"flows"`         // cached flows
	Both      int              `json:"flows_learned"` // of which learned both ways
	Endpoints []endpoints.View `json:"endpoints"`
	Agent     string           `json:"agent"`
	Notes     []string         `json:"notes,omitempty"`
}

// Inspect reads the live view of the fast path on target.
func Inspect(target string) (*View, error) {
	st, ms, err := datapath.LoadAttached[modeState](target, Name)
	if err != nil {
		return nil, err
	}
	p, err := openPinned(target, false)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	v := &View{Target: target, Notes: ms.Notes, Agent: agentKit.Status(st)}
	if ov := ms.Overlay; ov != nil {
		v.Layout, v.VXLAN, v.Underlay = ov.Layout, ov.VX.Dev.String(), ov.Underlay.String()
		v.SkipsOut, v.SkipsIn = Skipped(ov.Layout)
		if ov.OneWay {
			v.Notes = append(v.Notes, "one_way: ingress flows take the fast path once delivered, without waiting for a reply")
		}
	}
	if v.Egress, v.Ingress, err = p.counters(); err != nil {
		return nil, err
	}
	var k fpFpKey
	var f fpFpFlow
	it := p.PrgFastpathFlow.Iterate()
	for it.Next(&k, &f) {
		if f.Flags&fAlias != 0 {
			continue // a Service flow's translated view, not a flow of its own
		}
		v.Flows++
		if f.Flags&(fOut|fIn) == fOut|fIn {
			v.Both++
		}
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	if v.Endpoints, err = endpoints.List(p.tables()); err != nil {
		return nil, err
	}
	return v, nil
}

func (p *pinned) counters() (out, in Direction, err error) {
	out, in = Direction{}, Direction{}
	for d, dst := range []Direction{out, in} {
		for r, name := range Reasons {
			var per []uint64
			if err := p.PrgFastpathStat.Lookup(uint32(d*len(Reasons)+r), &per); err != nil {
				return nil, nil, fmt.Errorf("fastpath: read counters: %w", err)
			}
			for _, c := range per {
				dst[name] += c
			}
		}
	}
	return out, in, nil
}

// Report implements datapath.Reporter for `peregrine status`.
func (mode) Report(st *datapath.State) (string, error) {
	v, err := Inspect(st.Target)
	if err != nil {
		return "", err
	}
	return v.Format(), nil
}

// Fallbacks sums a direction's packets that took the normal path for a reason other than "not
// learned yet" (miss) and "not overlay traffic" (other).
func (d Direction) Fallbacks() uint64 {
	var n uint64
	for _, r := range Reasons {
		switch r {
		case "hit", "miss", "learned", "other", "dropped", "local":
		default:
			n += d[r]
		}
	}
	return n
}

func (d Direction) reasons() string {
	var parts []string
	for _, r := range Reasons {
		switch r {
		case "hit", "miss", "learned", "other", "local":
			continue
		}
		if d[r] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", r, d[r]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// Format renders the view as status lines.
func (v *View) Format() string {
	var b strings.Builder
	live := 0
	for _, e := range v.Endpoints {
		if e.Held {
			live++
		}
	}
	fmt.Fprintf(&b, "  fastpath: %s layout (%s over %s); %d flows cached, %d learned both ways; %d pods; agent %s\n",
		v.Layout, v.VXLAN, v.Underlay, v.Flows, v.Both, live, v.Agent)
	for _, d := range []struct {
		name, skips string
		c           Direction
	}{{"egress ", v.SkipsOut, v.Egress}, {"ingress", v.SkipsIn, v.Ingress}} {
		local := ""
		if d.c["local"] > 0 {
			local = fmt.Sprintf(" (%d to pods on this node)", d.c["local"])
		}
		fmt.Fprintf(&b, "  fastpath %s: hits %d%s, misses %d, learned %d, fallbacks %d (%s)\n", d.name, d.c["hit"], local, d.c["miss"], d.c["learned"], d.c.Fallbacks(), d.c.reasons())
		fmt.Fprintf(&b, "    skips: %s\n", d.skips)
	}
	for _, n := range v.Notes {
		fmt.Fprintf(&b, "    note: %s\n", n)
	}
	return b.String()
}

// Counters implements metrics.ModeCounters: packets per direction ("egress", "ingress") and
// result (Reasons), and the flow and pod tables' sizes.
func (mode) Counters(st *datapath.State) (map[[2]string]uint64, map[string]int, error) {
	v, err := Inspect(st.Target)
	if err != nil {
		return nil, nil, err
	}
	pk := map[[2]string]uint64{}
	for dir, d := range map[string]Direction{"egress": v.Egress, "ingress": v.Ingress} {
		for r, n := range d {
			pk[[2]string{dir, r}] = n
		}
	}
	live := 0
	for _, e := range v.Endpoints {
		if e.Held {
			live++
		}
	}
	return pk, map[string]int{"flows": v.Flows, "flows_learned": v.Both, "pods": live}, nil
}
