package fastpath

import (
	"fmt"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
)

// Reasons, in the order of the program's counters (FP_R_* in bpf/fastpath.bpf.c).
// The first baseReasons are prg_fastpath_stat's (FP_R_N); the rest, added after attachments in
// the field pinned that map's size, are prg_fastpath_stat2's (FP_R_N on) and prg_fastpath_stat3's
// (FP_R_N2 on: stat2's size was pinned as well).
var Reasons = []string{"hit", "miss", "stale", "not-ipv4", "l2", "ip-options", "fragment", "proto", "no-pod",
	"mtu", "ttl", "unsupported", "error", "dropped", "learned", "other", "nat", "big", "local", "budget", "full",
	"closed-lost",
	"closed-ct", "forged", "no-src"}

// baseReasons is FP_R_N: how many of Reasons prg_fastpath_stat counts; stat2Reasons is
// FP_R2_N, how many prg_fastpath_stat2 counts after them (its size is pinned in the field too);
// the rest are prg_fastpath_stat3's, stat3Cap (FP_R3_CAP) slots per overlay and direction.
const (
	baseReasons  = 22
	stat2Reasons = 1
	stat3Cap     = 16
)

// Direction is one direction's counters: packets per reason (Reasons).
type Direction map[string]uint64

// OverlayView is one overlay of a View.
type OverlayView struct {
	Index    int       `json:"index"`
	Layout   string    `json:"layout"`
	VXLAN    string    `json:"vxlan"`
	Underlay string    `json:"underlay"`
	VNI      int       `json:"vni"`
	Port     int       `json:"port"`
	VTEP     string    `json:"vtep"`
	Egress   Direction `json:"egress"`
	Ingress  Direction `json:"ingress"`
	Pods     []PodView `json:"pods"` // live endpoints of the overlay, by address
	On       bool      `json:"on"`   // its config is written (false: gone since, or detaching)
	Flows    int       `json:"flows"`
	Both     int       `json:"flows_learned"`
}

// PodView is one live pod of an overlay: its address and bridge-side veth.
type PodView struct {
	Addr string `json:"addr"`
	Veth string `json:"veth"`
	MAC  string `json:"mac"`
}

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
	Flows     int              `json:"flows"`         // cached flows (the per-address counters' sum)
	Both      int              `json:"flows_learned"` // of which learned both ways (estimated from a sample when above it)
	Sampled   bool             `json:"flows_learned_sampled,omitempty"`
	Table     int              `json:"flow_table"`            // the flow table's size (from the node's memory)
	Table6    int              `json:"flow_table6,omitempty"` // the IPv6 flow table's (bpf/fastpath6.h; as Table)
	Budget    int              `json:"flow_budget"`           // flows one pod may hold (0: no limit)
	TopPod    int              `json:"flows_top_pod"`         // the most flows one address holds
	Endpoints []endpoints.View `json:"endpoints"`
	Overlays  []OverlayView    `json:"overlays"` // each overlay served; Egress/Ingress/Flows above are their sums
	Agent     string           `json:"agent"`
	Notes     []string         `json:"notes,omitempty"`
}

// Inspect reads the live view of the fast path on target.
func Inspect(target string) (*View, error) {
	st, ms, err := datapath.LoadAttached[modeState](target, Name)
	if err != nil {
		return nil, err
	}
	p, err := openPinnedToRead(target) // also before an upgrade adds later maps
	if err != nil {
		return nil, err
	}
	defer p.Close()
	v := &View{Target: target, Notes: ms.Notes, Agent: agentKit.Status(st)}
	ovs := ms.overlays()
	if len(ovs) > 0 {
		ov := ovs[0]
		v.Layout, v.VXLAN, v.Underlay = ov.Layout, ov.VX.Dev.String(), ov.Underlay.String()
		v.SkipsOut, v.SkipsIn = Skipped(ov.Layout)
		if ov.OneWay {
			v.Notes = append(v.Notes, "one_way: ingress flows take the fast path once delivered, without waiting for a reply")
		}
	}
	if v.Endpoints, err = endpoints.List(p.tables()); err != nil {
		return nil, err
	}
	v.Egress, v.Ingress = Direction{}, Direction{}
	byIndex := map[int]int{}
	for _, ov := range ovs {
		ow := OverlayView{Index: ov.Index, Layout: ov.Layout, VXLAN: ov.VX.Dev.String(), Underlay: ov.Underlay.String(),
			VNI: ov.VNI, Port: ov.Port, VTEP: ov.VTEP.String()}
		if ow.Egress, ow.Ingress, err = p.counters(ov.Index); err != nil {
			return nil, err
		}
		var c fpFpCfg
		ow.On = p.PrgFastpathCfg.Lookup(uint32(ov.Index), &c) == nil && c.Flags&cOn != 0
		ow.Pods = livePods(ov, v.Endpoints)
		for r, n := range ow.Egress {
			v.Egress[r] += n
		}
		for r, n := range ow.Ingress {
			v.Ingress[r] += n
		}
		byIndex[ov.Index] = len(v.Overlays)
		v.Overlays = append(v.Overlays, ow)
	}
	// Counted, not walked: the per-address counters, and a bounded sample for the share
	// learned both ways, so status and /metrics cost the same at 10 or 1 000 000 flows.
	per, top, err := p.flowCounts()
	if err != nil {
		return nil, fmt.Errorf("fastpath: read flow counters: %w", err)
	}
	both, seen, err := p.learnedSample(flowSample)
	if err != nil {
		return nil, fmt.Errorf("fastpath: sample flows: %w", err)
	}
	v.Table = int(p.PrgFastpathFlow.MaxEntries())
	if p.PrgFastpathFlow6 != nil {
		v.Table6 = int(p.PrgFastpathFlow6.MaxEntries())
	}
	for o, n := range per {
		v.Flows += n
		v.TopPod = max(v.TopPod, top[o])
		if i, ok := byIndex[o]; ok {
			v.Overlays[i].Flows = n
			v.Overlays[i].Both = share(both[o], seen[o], n)
		}
	}
	nb, ns := 0, 0
	for o := range seen {
		nb, ns = nb+both[o], ns+seen[o]
	}
	v.Both = share(nb, ns, v.Flows)
	v.Sampled = ns >= flowSample
	for _, ov := range ovs {
		var c fpFpCfg
		if p.PrgFastpathCfg.Lookup(uint32(ov.Index), &c) == nil && c.Flags&cOn != 0 {
			v.Budget = int(c.Budget)
		}
	}
	return v, nil
}

// flowSample bounds the entries status reads to tell the share learned both ways.
const flowSample = 4096

// share scales both of seen sampled entries to n flows (exact when every flow was seen).
func share(both, seen, n int) int {
	if seen == 0 {
		return 0
	}
	if seen >= n {
		return both
	}
	return int(int64(both) * int64(n) / int64(seen))
}

// livePods are the held endpoints of an overlay's domain, with their veths' names as the
// overlay's namespace has them now.
func livePods(ov *overlay, eps []endpoints.View) []PodView {
	var out []PodView
	names := map[uint32]string{}
	if h, done, err := nlHandle(ov.VX.Dev.Netns); err == nil {
		for _, e := range eps {
			if e.Domain == ov.VX.Inode && e.Held {
				if l, err := h.LinkByIndex(int(e.Ifindex)); err == nil {
					names[e.Ifindex] = l.Attrs().Name
				}
			}
		}
		done()
	}
	for _, e := range eps {
		if e.Domain != ov.VX.Inode || !e.Held {
			continue
		}
		veth := names[e.Ifindex]
		if veth == "" {
			veth = "ifindex " + itoa(int(e.Ifindex))
		}
		out = append(out, PodView{Addr: e.Addr, Veth: veth, MAC: e.MAC})
	}
	return out
}

// counters are overlay ovl's counters (prg_fastpath_stat[(ovl*2 + dir)*FP_R_N + reason]; the
// later reasons' prg_fastpath_stat2[(ovl*2 + dir)*FP_R2_N + reason-FP_R_N] and
// prg_fastpath_stat3[(ovl*2 + dir)*FP_R3_CAP + reason-FP_R_N2], which an attachment made before
// them lacks until its upgrade adds the map: read as 0).
func (p *pinned) counters(ovl int) (out, in Direction, err error) {
	out, in = Direction{}, Direction{}
	for d, dst := range []Direction{out, in} {
		for r, name := range Reasons {
			m, i := p.PrgFastpathStat, (ovl*2+d)*baseReasons+r
			switch {
			case r >= baseReasons+stat2Reasons:
				m, i = p.PrgFastpathStat3, (ovl*2+d)*stat3Cap+r-baseReasons-stat2Reasons
			case r >= baseReasons:
				m, i = p.PrgFastpathStat2, (ovl*2+d)*stat2Reasons+r-baseReasons
			}
			if m == nil {
				continue
			}
			var per []uint64
			if err := m.Lookup(uint32(i), &per); err != nil {
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
		case "hit", "miss", "learned", "other", "dropped", "local", "closed-lost", "closed-ct":
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
		case "hit", "miss", "learned", "other", "local", "closed-lost", "closed-ct":
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

// Format renders the view as status lines: the sums, then each overlay with its live pods.
func (v *View) Format() string {
	var b strings.Builder
	live := 0
	for _, e := range v.Endpoints {
		if e.Held {
			live++
		}
	}
	est := ""
	if v.Sampled {
		est = "~"
	}
	fmt.Fprintf(&b, "  fastpath: %d overlay(s); %d flows cached, %s%d learned both ways; %d pods; agent %s\n",
		len(v.Overlays), v.Flows, est, v.Both, live, v.Agent)
	budget := "no limit"
	if v.Budget > 0 {
		budget = fmt.Sprintf("%d per pod", v.Budget)
	}
	table := fmt.Sprintf("%d entries", v.Table)
	if v.Table6 > 0 {
		table += fmt.Sprintf(" (IPv6 table %d)", v.Table6)
	}
	fmt.Fprintf(&b, "  flow table: %s (from the node's memory), budget %s, most held by one address %d\n",
		table, budget, v.TopPod)
	for _, d := range []struct {
		name string
		c    Direction
	}{{"egress ", v.Egress}, {"ingress", v.Ingress}} {
		local := ""
		if d.c["local"] > 0 {
			local = fmt.Sprintf(" (%d to pods on this node)", d.c["local"])
		}
		fmt.Fprintf(&b, "  fastpath %s: hits %d%s, misses %d, learned %d, fallbacks %d (%s)\n", d.name, d.c["hit"], local, d.c["miss"], d.c["learned"], d.c.Fallbacks(), d.c.reasons())
	}
	if n := v.Egress["closed-lost"] + v.Ingress["closed-lost"]; n > 0 {
		// The agent's ring of connections closed on the fast path was full (ctclosed.go).
		fmt.Fprintf(&b, "  connections closed on the fast path whose conntrack entry the agent could not delete (its ring was full): %d\n", n)
	}
	if n := v.Egress["closed-ct"] + v.Ingress["closed-ct"]; n > 0 {
		// Expired by the program at the close (fastpath_closed.h): the agent had nothing to do.
		fmt.Fprintf(&b, "  connections closed on the fast path whose conntrack entry the program expired itself: %d\n", n)
	}
	for _, o := range v.Overlays {
		state := ""
		if !o.On {
			state = " (off: its device is gone)"
		}
		fmt.Fprintf(&b, "  overlay %d: %s layout, %s over %s (vni %d, port %d, vtep %s)%s: %d flows, %d learned both ways\n",
			o.Index, o.Layout, o.VXLAN, o.Underlay, o.VNI, o.Port, o.VTEP, state, o.Flows, o.Both)
		fmt.Fprintf(&b, "    egress hits %d, misses %d, fallbacks %d; ingress hits %d, misses %d, fallbacks %d\n",
			o.Egress["hit"], o.Egress["miss"], o.Egress.Fallbacks(), o.Ingress["hit"], o.Ingress["miss"], o.Ingress.Fallbacks())
		var pods []string
		for _, p := range o.Pods {
			pods = append(pods, p.Addr+" ("+p.Veth+")")
		}
		if len(pods) == 0 {
			pods = []string{"none"}
		}
		fmt.Fprintf(&b, "    pods (live): %s\n", strings.Join(pods, ", "))
		out, in := Skipped(o.Layout)
		fmt.Fprintf(&b, "    egress skips: %s\n    ingress skips: %s\n", out, in)
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
