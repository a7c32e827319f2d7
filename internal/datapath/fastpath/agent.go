package fastpath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The node agent keeps the caches honest. It listens to netlink in the host namespace and the
// VXLAN device's: a neighbour or FDB entry that changes its address, a route change, a change
// of the underlay or VXLAN device (MTU, addresses, settings), or a netfilter rule change
// (nfwatch.go) forgets every cached flow (they
// re-learn from the normal path within a round trip); a pod that comes, goes or changes MAC or
// address gets its endpoint rewritten and its flows forgotten, and a new pod's veth gets the
// programs. It also re-reads everything every resyncEvery, so a change netlink does not report
// (a MAC changed inside a pod's namespace) is caught within that. Correctness does not hinge on
// it: the programs check the pod's veth and MAC on every packet and re-learn every flow every
// few seconds.

const (
	resyncEvery = time.Second
	// Flows expire by an eBPF timer that sweeps the table each second (bpf/fastpath.h: 60 s idle, 10 s never learned both
	// ways, 2 s after a TCP FIN/RST), not by a walk of the table here.
)

// agentKit starts, stops and describes the node agent (internal/datapath/agentproc).
const agentKit = agentproc.Agent(Name)

// RunAgent implements datapath.AgentRunner.
func (mode) RunAgent(ctx context.Context, target string) error {
	return agentKit.Run(ctx, target, 0, runAgent)
}

func runAgent(ctx context.Context, st *datapath.State, lg datapath.Logger) error {
	target := st.Target
	ms, err := datapath.LoadModeState[modeState](st)
	ovs := ms.overlays()
	if err != nil || len(ovs) == 0 {
		return errors.Join(errors.New("fastpath: record has no overlay"), err)
	}
	var c Config
	if err := datapath.RecordedConfig(st, &c); err != nil {
		c.OneWay = ovs[0].OneWay // a record of an older peregrine: as the overlay says
	}
	p, err := openPinned(target, indices(ovs)...)
	if err != nil {
		return err
	}
	defer p.Close()
	a := &agent{target: target, p: p, lg: lg, flush: make(chan string, 1), neigh: map[string]string{},
		only: c.VXLANDev, oneWay: c.OneWay, noted: map[string]bool{}, gens: map[int]uint32{}}
	for _, ov := range ovs { // the generation attach (or a predecessor) wrote: its flows stay
		var cur fpFpCfg
		if p.PrgFastpathCfg.Lookup(uint32(ov.Index), &cur) == nil && cur.Flags&cOn != 0 {
			a.gens[ov.Index] = cur.Gen
			a.budget = cur.Budget
		}
	}
	a.ovs.Store(&ovs)
	w := datapath.Watch{Neighs: true, Routes: true, Event: a.event, NeighsSubscribed: a.learnNeighs,
		Debounce: 20 * time.Millisecond, Every: resyncEvery, SyncFirst: true, Sync: a.syncAll, Log: lg}
	for _, ov := range ovs {
		lg.Printf("started: %s (%s layout, overlay %d)", ov.VX.Dev, ov.Layout, ov.Index)
	}
	nss := []string{target}
	for _, ov := range ovs {
		if !slices.Contains(nss, ov.VX.Dev.Netns) {
			nss = append(nss, ov.VX.Dev.Netns)
		}
	}
	a.ctNS = nss // before anything can forget a flow: forget marks TCP entries liberal there
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the netfilter subscriptions end with the loop
	// A rule change forgets every flow at once, not at the next round of the loop (up to
	// resyncEvery later): the bound is the debounce and a config write per overlay.
	watchNetfilter(ctx, nss, lg, resyncEvery, func(why string) {
		a.forgetAll(why)
	})
	a.followPolicy(ctx, nss) // conntrack deletions, ipsets, conntrack's TCP window (policy.go)
	return w.Run(ctx, nss)
}

// syncAll is one round of the watch loop: forget every flow when a change asked for it, forget
// the idle ones once a resyncEvery, and sync the overlay and the pods.
func (a *agent) syncAll(context.Context) error {
	cur, err := datapath.LoadState(a.target, Name)
	if err != nil || cur == nil {
		return datapath.ErrNotAttached
	}
	select {
	case why := <-a.flush:
		a.forgetAll(why)
	default:
	}
	a.sync(cur)
	return nil
}

type agent struct {
	target string
	p      *pinned
	lg     datapath.Logger
	ovs    atomic.Pointer[[]*overlay] // read by the netlink watchers, replaced by sync
	only   []string                   // option vxlan_dev
	oneWay bool                       // option one_way
	noted  map[string]bool            // overlays the agent logged it cannot serve
	flush  chan string                // why every flow must go (a watched device or neighbour changed)
	cfgMu  sync.Mutex                 // guards gens, budget and the config writes
	gens   map[int]uint32             // each overlay's flow generation (cfg.gen)
	budget uint32                     // flows per local address (cfg.budget)
	mu     sync.Mutex                 // guards neigh (one watcher per namespace)
	neigh  map[string]string          // neighbour/FDB key -> address, to tell a real change from a state change
	ctNS   []string                   // namespaces whose conntrack entries forget makes liberal (ctliberal.go)
	ctSelf selfDeleted                // conntrack entries the agent deleted itself (ctclosed.go)
	lrn    learnedOnce                // the ring of flows due for liberal marking (learnring.go)
}

// putCfg writes an overlay's config with the current budget; forget gives it a new flow
// generation, which forgets every flow of the overlay at once (no walk of the table).
func (a *agent) putCfg(ov *overlay, forget bool) error {
	a.cfgMu.Lock()
	defer a.cfgMu.Unlock()
	c := ov.cfg()
	if forget || a.gens[ov.Index] == 0 {
		a.gens[ov.Index] = nextGen()
	}
	c.Gen, c.Budget = a.gens[ov.Index], a.budget
	if err := a.p.PrgFastpathCfg.Put(uint32(ov.Index), c); err != nil {
		return err
	}
	_, err := putU6(a.p, ov.Underlay.Netns, ov) // flannel-v6.1's device may have changed (u6.go)
	return err
}

// forgetAll forgets every flow of every overlay: a new generation each. The learned TCP
// flows' conntrack entries are made liberal first (one walk, ctliberal.go): a forgotten flow's
// next packet meets conntrack far beyond the window it last saw, which strict tracking calls
// INVALID and kube-proxy drops, stalling the connection for good.
func (a *agent) forgetAll(why string) {
	a.table4().liberalAll(a)
	a.table6().liberalAll(a) // the IPv6 table's (ctliberal6.go)
	var n []string
	for _, ov := range *a.ovs.Load() {
		if err := a.putCfg(ov, true); err != nil {
			a.lg.Printf("%s: write config of %s: %v", why, ov.VX.Dev, err)
			continue
		}
		n = append(n, ov.VX.Dev.String())
	}
	a.lg.Printf("%s: forgot every flow of %s", why, strings.Join(n, ", "))
}

// setBudget divides the flow table among the live pods; the configs follow when it changed.
func (a *agent) setBudget(pods int, ovs []*overlay) {
	b := flowBudget(a.p.PrgFastpathFlow.MaxEntries(), pods)
	a.cfgMu.Lock()
	same := b == a.budget
	a.budget = b
	a.cfgMu.Unlock()
	if same {
		return
	}
	for _, ov := range ovs {
		if err := a.putCfg(ov, false); err != nil {
			a.lg.Printf("write config: %v", err)
		}
	}
	a.lg.Printf("flow budget: %d flows per pod (%d live, table %d)", b, pods, a.p.PrgFastpathFlow.MaxEntries())
}

func (a *agent) flushFor(why string) {
	select {
	case a.flush <- why:
	default:
	}
}

// sync re-reads the overlays and the pods: a changed overlay rewrites its config and forgets its
// flows; an overlay that appeared (docker creates an overlay's namespace when the node's first
// container joins it) gets its copy of the programs, one that went away its config off;
// changed pods get new endpoints (their flows forgotten) and new veths the programs. The record
// follows the overlays, so status lists the live ones.
func (a *agent) sync(st *datapath.State) {
	t, err := datapath.Discover(st.Target, st.Options.Underlay)
	if err != nil {
		a.lg.Printf("discover: %v", err)
		return
	}
	live, _, err := readOverlays(t, st.Options.Underlay, a.only)
	if err != nil {
		a.lg.Printf("overlays: %v", err)
		return
	}
	old := *a.ovs.Load()
	byDev := map[string]*overlay{}
	used := map[int]bool{}
	for _, ov := range old {
		byDev[ov.VX.Dev.String()] = ov
		used[ov.Index] = true
	}
	var next []*overlay
	changedSet := false
	for _, ov := range live {
		ov.OneWay = a.oneWay // an option, not a device setting
		prev := byDev[ov.VX.Dev.String()]
		if prev == nil {
			if a.add(ov, used) {
				next = append(next, ov)
				changedSet = true
			}
			continue
		}
		delete(byDev, ov.VX.Dev.String())
		ov.Index = prev.Index
		next = append(next, ov)
		if ov.cfg() == prev.cfg() {
			continue
		}
		if err := a.putCfg(ov, true); err != nil {
			a.lg.Printf("write config: %v", err)
			continue
		}
		changedSet = true
		a.lg.Printf("overlay changed (%s mtu %d vtep %s port %d vni %d): config rewritten, its flows forgotten",
			ov.VX.Dev, ov.MTU, ov.VTEP, ov.Port, ov.VNI)
	}
	for _, gone := range byDev {
		// Its device is gone (the kernel removed its links with it): off, flows forgotten.
		_ = a.p.PrgFastpathCfg.Put(uint32(gone.Index), fpFpCfg{})
		n := a.forgetOverlay(gone.Index)
		a.lg.Printf("overlay %s is gone: config off, forgot %d flows", gone.VX.Dev, n)
		changedSet = true
	}
	slices.SortFunc(next, func(x, y *overlay) int { return x.Index - y.Index })
	a.ovs.Store(&next)
	a.record(st, t, next, changedSet)
	var eps []endpoints.Endpoint
	perOv := map[int][]endpoints.Endpoint{}
	nsByInode := map[uint32]string{}
	for _, ov := range next {
		e, _ := discoverPods(t, ov)
		perOv[ov.Index] = e
		eps = append(eps, e...)
		nsByInode[ov.VX.Inode] = ov.VX.Dev.Netns
	}
	rep, err := endpoints.Sync(a.p.tables(), eps, time.Now())
	if err != nil {
		a.lg.Printf("endpoints: %v", err)
	}
	if err == nil {
		a.setBudget(rep.Live, next)
	}
	if len(rep.Changed) > 0 {
		n := a.forgetEndpoints(rep.Changed)
		a.lg.Printf("endpoints: %d live, %d added, %d updated, %d gone: forgot %d flows", rep.Live, rep.Added, rep.Updated, rep.Gone, n)
	}
	for _, ov := range next {
		if n, err := attachPods(a.p, a.target, ov, perOv[ov.Index]); err != nil {
			a.lg.Printf("attach: %v", err)
		} else if n > 0 {
			a.lg.Printf("programs attached to %d new pod veths of %s", n, ov.VX.Dev)
		}
	}
	if ino, err := netnsutil.Inode(netnsutil.Path(a.target)); err == nil {
		nsByInode[uint32(ino)] = a.target
	}
	pruneLinks(a.target, nsByInode)
}

// add gives an overlay that appeared after attach a free index and its copy of the programs,
// writes its config and attaches it; false (logged once) when it cannot.
func (a *agent) add(ov *overlay, used map[int]bool) bool {
	fail := func(why string, err error) bool {
		if !a.noted[ov.VX.Dev.String()] {
			a.noted[ov.VX.Dev.String()] = true
			a.lg.Printf("new overlay %s: %s: %v; its traffic takes the normal path", ov.VX.Dev, why, err)
		}
		return false
	}
	ov.Index = -1
	for i := range maxOverlays {
		if !used[i] {
			ov.Index = i
			break
		}
	}
	if ov.Index < 0 {
		return fail("no free slot", fmt.Errorf("%d overlays served", maxOverlays))
	}
	if ov.Index != 0 && a.p.more[ov.Index] == nil {
		pp, err := loadOverlayPrograms(&a.p.fpMaps, ov.Index)
		if err != nil {
			return fail("load programs", err)
		}
		dir := datapath.ModePinDir(a.target, Name)
		for name := range progsOf(pp) {
			_ = os.Remove(filepath.Join(dir, progPin(name, ov.Index))) // a gone overlay's
		}
		if err := pinPrograms(pp, dir, ov.Index); err != nil {
			pp.Close()
			return fail("pin programs", err)
		}
		a.p.more[ov.Index] = pp
	}
	if err := a.putCfg(ov, true); err != nil {
		return fail("write config", err)
	}
	if err := attachOverlay(a.p, a.target, ov); err != nil {
		_ = a.p.PrgFastpathCfg.Put(uint32(ov.Index), fpFpCfg{})
		return fail("attach", err)
	}
	used[ov.Index] = true
	delete(a.noted, ov.VX.Dev.String())
	a.lg.Printf("new overlay %s (%s layout, vni %d): overlay %d", ov.VX.Dev, ov.Layout, ov.VNI, ov.Index)
	return true
}

// record writes the live overlays (when they changed) and devices (when pods came or went)
// into the attachment's record: status lists what is there now, not what was at attach.
func (a *agent) record(st *datapath.State, t *datapath.Topology, ovs []*overlay, ovsChanged bool) {
	devsChanged := st.Topology == nil || devSet(st.Topology) != devSet(t)
	if (!ovsChanged && !devsChanged) || len(ovs) == 0 {
		return
	}
	// Under the attach/detach lock, on the record as saved now: a detach that removed it in
	// the meantime is not undone.
	err := datapath.UpdateState(a.target, Name, time.Second, func(cur *datapath.State) error {
		if !cur.Attached.Equal(st.Attached) {
			return datapath.ErrNotAttached // another attachment's record
		}
		ms, err := datapath.LoadModeState[modeState](cur)
		if err != nil {
			return err
		}
		ms.Overlays, ms.Overlay = ovs, ovs[0]
		if devsChanged {
			nt := *t
			if cur.Topology != nil {
				nt.Notes = cur.Topology.Notes // attach's notes stay
			}
			cur.Topology = &nt
		}
		datapath.SetModeState(cur, ms)
		return nil
	})
	if err != nil && !errors.Is(err, datapath.ErrNotAttached) {
		a.lg.Printf("record: %v", err)
	}
}

// devSet is a topology's devices as one comparable string.
func devSet(t *datapath.Topology) string {
	var ds []string
	for _, d := range t.Devs {
		ds = append(ds, d.Stage+" "+d.String()+" "+itoa(d.Ifindex))
	}
	slices.Sort(ds)
	return strings.Join(ds, "\n")
}

// forgetOverlay forgets the flows of both tables (IPv4 and IPv6) of the overlay with index ovl
// and its per-address counters, and returns how many flows went.
func (a *agent) forgetOverlay(ovl int) int {
	n := a.forget(func(k fpFpKey, _ *fpFpFlow) bool { return int(k.Ovl) == ovl })
	n += a.forget6(func(k fpFpKey6, _ *fpFpFlow) bool { return int(k.Ovl) == ovl })
	a.p.forgetCounts(func(o int, _ uint32, _ bool) bool { return o == ovl })
	return n
}

// forgetEndpoints forgets the flows whose local address is one of the changed (added, updated
// or gone) endpoints, IPv4 ones from the IPv4 table and IPv6 ones from the IPv6 table, and
// returns how many went. A pod's flows name its address, not its netns, so any netns counts.
func (a *agent) forgetEndpoints(changed []endpoints.Key) int {
	v4 := map[uint32]bool{}
	v6 := map[[4]uint32]bool{}
	for _, k := range changed {
		switch k.Family {
		case 4:
			v4[k.Addr[0]] = true
		case 6:
			v6[k.Addr] = true
		}
	}
	n := 0
	if len(v4) > 0 {
		n += a.forget(func(k fpFpKey, _ *fpFpFlow) bool { return v4[k.Local] })
		a.p.forgetCounts(func(_ int, local uint32, ipv4 bool) bool { return ipv4 && v4[local] })
	}
	if len(v6) > 0 {
		// forget6 counts each deleted entry down in its address's counter.
		n += a.forget6(func(k fpFpKey6, _ *fpFpFlow) bool { return v6[k.Local] })
	}
	return n
}

// forget deletes the flows drop selects and returns how many.
func (a *agent) forget(drop func(fpFpKey, *fpFpFlow) bool) int {
	return a.table4().forget(a, drop) // its counters go by forgetCounts
}

// event sorts an update of the watch loop: a change of the underlay or the VXLAN device, of one
// of their neighbour/FDB entries' addresses, or of a route (outside the local table) forgets
// every flow; any link change resyncs the pods.
func (a *agent) event(ns string, u any) bool {
	switch u := u.(type) {
	case netlink.LinkUpdate:
		if a.watched(ns, int(u.Index)) {
			// The underlay or the VXLAN device changed (MTU, address, state...).
			a.flushFor("device change on " + u.Attrs().Name)
		}
		return true
	case netlink.NeighUpdate:
		if a.neighChanged(ns, u) {
			a.flushFor("neighbour/FDB change on ifindex " + itoa(u.LinkIndex))
			return true
		}
	case netlink.RouteUpdate:
		if u.Table != unix.RT_TABLE_LOCAL { // addresses of devices coming and going: the link event covers them
			a.flushFor("route change " + u.Dst.String())
			return true
		}
	}
	return false
}

// neighChanged tells whether a neighbour or FDB entry of the underlay or the VXLAN device (the
// ones a cached header depends on) appeared, went away or changed its address; a mere state
// change (REACHABLE -> STALE) does not affect a cached header.
func (a *agent) neighChanged(ns string, u netlink.NeighUpdate) bool {
	if !a.watched(ns, u.LinkIndex) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key, val := neighKey(ns, u.Neigh)
	old, known := a.neigh[key]
	if u.Type == unix.RTM_DELNEIGH {
		delete(a.neigh, key)
		return true
	}
	if u.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) != 0 || val == "" {
		return false
	}
	a.neigh[key] = val
	return !known || old != val
}

func (a *agent) watched(ns string, ifindex int) bool {
	var d fpFpU6dev
	u6 := a.p.PrgFastpathU6dev != nil && a.p.PrgFastpathU6dev.Lookup(uint32(0), &d) == nil && d.Ifindex != 0
	for _, ov := range *a.ovs.Load() {
		if ns == a.target && ifindex == ov.Underlay.Ifindex || ns == ov.VX.Dev.Netns && ifindex == ov.VX.Dev.Ifindex {
			return true
		}
		// flannel-v6.1 (u6.go), beside the routed device: tx_u6 sends by its neighbour's MAC.
		if u6 && ns == ov.VX.Dev.Netns && ifindex == int(d.Ifindex) {
			return true
		}
	}
	return false
}

func neighKey(ns string, n netlink.Neigh) (key, val string) {
	key = ns + "|" + itoa(n.LinkIndex) + "|" + itoa(n.Family)
	if n.Family == unix.AF_BRIDGE {
		return key + "|" + n.HardwareAddr.String(), n.IP.String()
	}
	return key + "|" + n.IP.String(), hw(n.HardwareAddr)
}

// learnNeighs records the current entries of the watched devices of ns, so the first event of
// an entry is compared with what it was.
func (a *agent) learnNeighs(ns string) {
	nsh, err := netnsutil.Handle(ns)
	if err != nil {
		return
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return
	}
	defer h.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, fam := range []int{netlink.FAMILY_V4, unix.AF_BRIDGE} {
		ns2, err := h.NeighList(0, fam)
		if err != nil {
			continue
		}
		for _, n := range ns2 {
			if a.watched(ns, n.LinkIndex) {
				if k, v := neighKey(ns, n); v != "" {
					a.neigh[k] = v
				}
			}
		}
	}
}

func hw(m net.HardwareAddr) string {
	if len(m) == 0 {
		return ""
	}
	return m.String()
}

func itoa(i int) string { return fmtInt(int64(i)) }
