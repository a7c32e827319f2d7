package ezpath

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// The controller runs in the node agent of the lab's first host (`peregrine agent ezpath
// --target=prg-<lab>-h1`, started by attach, stopped by detach).

// RunAgent implements datapath.AgentRunner.
func (mode) RunAgent(ctx context.Context, target string) error {
	return agentKit.Run(ctx, target, 0, runAgent)
}

func runAgent(ctx context.Context, st *datapath.State, lg datapath.Logger) error {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		return err
	}
	cfg := ms.Config
	classes := Classes{}
	if cfg.Classes != "" {
		if classes, err = LoadClasses(cfg.Classes); err != nil {
			return err
		}
	}
	c := &controller{cfg: cfg, classes: classes, plan: newPlanner(cfg), rates: newSampler(), log: lg.Printf}
	lg.Printf("started: policy %s, interval %s, table %d (budget %d), active %d, idle %d, min rate %.0f B/s",
		cfg.Policy, cfg.Interval, cfg.TableSize, cfg.Budget(), cfg.Active, cfg.Idle, cfg.MinRate)
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		if err := c.round(time.Now()); err != nil {
			lg.Printf("round: %v", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

type controller struct {
	cfg     Config
	classes Classes
	plan    *planner
	rates   *sampler
	log     func(string, ...any)
}

// round is one polling interval: read the switches, decide, act in the mandatory order,
// record the view.
func (c *controller) round(now time.Time) error {
	r, err := openRack(c.cfg.Lab)
	if err != nil {
		return err
	}
	counts, err := r.readFlows()
	if err != nil {
		return err
	}
	led, err := ReadLedger(c.cfg.Lab)
	if err != nil {
		return err
	}
	views, stats := r.view(counts, led, c.classes, func(k FlowKey, b uint64) float64 { return c.rates.rate(k, b, now) })
	var errs []error
	notes := map[string]string{}
	if c.cfg.Policy == "auto" {
		p := c.plan.step(stats, led.Pairs, func(a, b string) []torEntry {
			ea, err1 := r.endpoint(a)
			eb, err2 := r.endpoint(b)
			if err1 != nil || err2 != nil {
				return nil
			}
			return r.entries(ea, eb)
		})
		for _, u := range p.Unoffload {
			c.log("un-offload %s <-> %s (idle %d intervals)", u.A, u.B, c.cfg.Idle)
			errs = append(errs, Unoffload(c.cfg.Lab, u.A, u.B, c.cfg.Drain))
		}
		for _, o := range p.Offload {
			c.log("offload %s <-> %s (%.1f MB/s, class %s)", o.A, o.B, o.Rate/1e6, o.Class)
			if err := Offload(c.cfg.Lab, o.A, o.B, "auto"); err != nil {
				c.log("%v", err)
				notes[pairKey(o.A, o.B)] = err.Error()
				if !errors.Is(err, ErrTableFull) {
					errs = append(errs, err)
				}
			}
		}
		for k, why := range p.Refused {
			notes[k] = why
		}
	}
	errs = append(errs, withLedger(c.cfg.Lab, func(l *Ledger) error {
		on := map[string]bool{}
		for _, p := range l.Pairs {
			on[pairKey(p.A, p.B)] = true
		}
		for i := range views {
			k := pairKey(views[i].Src, views[i].Dst)
			if on[k] {
				views[i].State, views[i].Where = "offloaded", r.where(views[i], true)
			}
			if n, ok := notes[k]; ok && !on[k] {
				views[i].Note = n
			}
		}
		l.Flows, l.Polled = views, now
		return nil
	}))
	return errors.Join(errs...)
}

// readFlows reads the flow registers of every attached host's switch.
func (r *rack) readFlows() ([]FlowCount, error) {
	var all []FlowCount
	for i := 1; i <= r.hw.Hosts(); i++ {
		if !r.attached(i) {
			continue
		}
		tt, err := openTorTables(r.torDir(i))
		if err != nil {
			return nil, err
		}
		fs, err := readFlowTable(tt.EzpFlowBytes)
		tt.Close()
		if err != nil {
			return nil, err
		}
		all = append(all, fs...)
	}
	return all, nil
}

// view names the flows' containers, their rates, state and path, and sums them per pair.
func (r *rack) view(counts []FlowCount, led *Ledger, classes Classes, rate func(FlowKey, uint64) float64) ([]FlowView, []pairStat) {
	on := map[string]bool{}
	for _, p := range led.Pairs {
		on[pairKey(p.A, p.B)] = true
	}
	var views []FlowView
	pairs := map[string]*pairStat{}
	var order []string
	for _, fc := range counts {
		t := r.tenantOfVNI(fc.Key.VNI) // the VNI tells the tenant: addresses overlap
		a, ok1 := r.endpointAt(t, fc.Key.Src)
		b, ok2 := r.endpointAt(t, fc.Key.Dst)
		if !ok1 || !ok2 {
			continue // not between the lab's containers
		}
		v := FlowView{Key: fc.Key, Src: a.Name, Dst: b.Name, Rate: rate(fc.Key, fc.Bytes), Bytes: fc.Bytes, Packets: fc.Packets,
			State: "overlay", Class: classes.pairClass(a, b)}
		k := pairKey(a.Name, b.Name)
		if on[k] {
			v.State = "offloaded"
		}
		v.Where = r.where(v, on[k])
		views = append(views, v)
		ps := pairs[k]
		if ps == nil {
			ps = &pairStat{A: a.Name, B: b.Name, Class: v.Class}
			pairs[k] = ps
			order = append(order, k)
		}
		ps.Rate += v.Rate
	}
	sort.Slice(views, func(i, j int) bool { return views[i].Rate > views[j].Rate })
	var stats []pairStat
	for _, k := range order {
		stats = append(stats, *pairs[k])
	}
	return views, stats
}

// where describes the path a flow takes.
func (r *rack) where(v FlowView, offloaded bool) string {
	a, _ := r.endpoint(v.Src)
	b, _ := r.endpoint(v.Dst)
	if offloaded {
		return fmt.Sprintf("h%d tag %d > tor%d VXLAN > tor%d untag > h%d", a.Host, r.vid(a.Tenant), a.Host, b.Host, b.Host)
	}
	return fmt.Sprintf("h%d VXLAN (host VTEP) > tor%d > tor%d routed > h%d VXLAN", a.Host, a.Host, b.Host, b.Host)
}

// Flows returns the lab's flows: the controller's last poll when it is recent, otherwise two
// reads of the switches' registers window apart.
func Flows(labName string, window time.Duration) ([]FlowView, error) {
	led, err := ReadLedger(labName)
	if err != nil {
		return nil, err
	}
	if !led.Polled.IsZero() && time.Since(led.Polled) < 3*time.Second {
		return led.Flows, nil
	}
	r, err := openRack(labName)
	if err != nil {
		return nil, err
	}
	s := newSampler()
	counts, err := r.readFlows()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	for _, fc := range counts {
		s.rate(fc.Key, fc.Bytes, t0)
	}
	time.Sleep(window)
	if counts, err = r.readFlows(); err != nil {
		return nil, err
	}
	now := time.Now()
	views, _ := r.view(counts, led, Classes{}, func(k FlowKey, b uint64) float64 { return s.rate(k, b, now) })
	return views, nil
}

// Report implements datapath.Reporter for `peregrine status`.
func (mode) Report(st *datapath.State) (string, error) {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		return "", err
	}
	r, err := openRack(ms.Config.Lab)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	ht, err := openHostTables(r.hostDir(ms.Host))
	if err != nil {
		return "", err
	}
	hs, err := hostStats(ht)
	ht.Close()
	if err != nil {
		return "", err
	}
	tt, err := openTorTables(r.torDir(ms.Host))
	if err != nil {
		return "", err
	}
	ts, err := torStats(tt)
	encN, decN := countEntries(tt.EzpEncap), countEntries(tt.EzpDecap)
	size := tt.EzpEncap.MaxEntries()
	tt.Close()
	if err != nil {
		return "", err
	}
	led, _ := ReadLedger(ms.Config.Lab)
	agent := "none on this host (the lab's controller runs with h1)"
	if st.AgentPID != 0 {
		agent = agentKit.Status(st)
		if agentKit.Running(st) {
			agent += fmt.Sprintf(" (policy %s, every %s)", ms.Config.Policy, ms.Config.Interval)
		}
	}
	var tenants []string
	for tn := 1; tn <= r.tenants; tn++ {
		tenants = append(tenants, fmt.Sprintf("VID %d = VNI %d", r.vid(tn), r.vni(tn)))
	}
	what := "tenant"
	if r.tenants > 1 {
		what = fmt.Sprintf("%d tenants:", r.tenants)
	}
	fmt.Fprintf(&b, "  ezpath: lab %s, host h%d, switch tor%d (VTEP %s), %s %s; controller %s\n",
		ms.Config.Lab, ms.Host, ms.Host, r.vtep(ms.Host), what, strings.Join(tenants, ", "), agent)
	fmt.Fprintf(&b, "  ezpath: tor%d tables: ezp_encap %d/%d, ezp_decap %d/%d (budget %d); offloaded pairs in the lab: %d\n",
		ms.Host, encN, size, decN, size, ms.Config.Budget(), len(led.Pairs))
	fmt.Fprintf(&b, "  ezpath: host: tagged %d, relayed %d, from switch %d, delivered %d; dropped: VID %d, pod %d, not IP %d, errors %d\n",
		hs["tagged"], hs["relayed"], hs["up_tagged"], hs["delivered"], hs["miss_vid"], hs["miss_pod"], hs["not_ip"], hs["errors"])
	fmt.Fprintf(&b, "  ezpath: tor%d: encap %d, decap %d, overlay in transit %d; dropped: VID %d, encap %d, route %d, decap %d, errors %d\n",
		ms.Host, ts["encap"], ts["decap"], ts["transit"], ts["miss_vni"], ts["miss_encap"], ts["miss_route"], ts["miss_decap"], ts["errors"])
	for _, n := range ms.Notes {
		fmt.Fprintf(&b, "    note: %s\n", n)
	}
	return b.String(), nil
}
