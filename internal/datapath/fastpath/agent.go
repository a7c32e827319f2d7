package fastpath

import (
	"context"
	"errors"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
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
	idleAfter   = 60 * time.Second // flows neither direction learned for this long are dropped
)

// agentKit starts, stops and describes the node agent (internal/datapath/agentproc).
const agentKit = agentproc.Agent(Name)

// RunAgent implements datapath.AgentRunner.
func (mode) RunAgent(ctx context.Context, target string) error {
	return agentKit.Run(ctx, target, 0, runAgent)
}

func runAgent(ctx context.Context, st *datapath.State, lg *log.Logger) error {
	target := st.Target
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil || ms.Overlay == nil {
		return errors.Join(errors.New("fastpath: record has no overlay"), err)
	}
	p, err := openPinned(target, true)
	if err != nil {
		return err
	}
	defer p.Close()
	a := &agent{target: target, p: p, lg: lg, flush: make(chan string, 1), neigh: map[string]string{}}
	a.ov.Store(ms.Overlay)
	w := datapath.Watch{Neighs: true, Routes: true, Event: a.event, NeighsSubscribed: a.learnNeighs,
		Debounce: 20 * time.Millisecond, Every: resyncEvery, SyncFirst: true, Sync: a.syncAll, Log: lg}
	lg.Printf("started (%s layout)", ms.Overlay.Layout)
	nss := []string{target, ms.Overlay.VX.Dev.Netns}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the netfilter subscriptions end with the loop
	// A rule change forgets every flow at once, not at the next round of the loop (up to
	// resyncEvery later): the bound is the debounce and a map walk.
	watchNetfilter(ctx, nss, lg, resyncEvery, func(why string) {
		lg.Printf("%s: forgot %d flows", why, a.forget(func(fpFpKey, *fpFpFlow) bool { return true }))
	})
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
		n := a.forget(func(fpFpKey, *fpFpFlow) bool { return true })
		a.lg.Printf("%s: forgot %d flows", why, n)
	default:
	}
	if time.Since(a.expired) >= resyncEvery {
		a.expired = time.Now()
		now := monoNs()
		a.forget(func(_ fpFpKey, f *fpFpFlow) bool {
			last := max(f.OutNs, f.InNs)
			return last != 0 && now-last > uint64(idleAfter)
		})
	}
	a.sync(cur)
	return nil
}

type agent struct {
	target  string
	p       *pinned
	lg      *log.Logger
	ov      atomic.Pointer[overlay] // read by the netlink watchers, replaced by sync
	flush   chan string             // why every flow must go (a watched device or neighbour changed)
	expired time.Time               // when idle flows were last forgotten
	mu      sync.Mutex              // guards neigh (one watcher per namespace)
	neigh   map[string]string       // neighbour/FDB key -> address, to tell a real change from a state change
}

func monoNs() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return uint64(ts.Nano())
}

func (a *agent) flushFor(why string) {
	select {
	case a.flush <- why:
	default:
	}
}

// sync re-reads the overlay and the pods: a changed overlay rewrites the config and forgets
// every flow; changed pods get new endpoints (their flows forgotten) and new veths the programs.
func (a *agent) sync(st *datapath.State) {
	t, err := datapath.Discover(st.Target, st.Options.Underlay)
	if err != nil {
		a.lg.Printf("discover: %v", err)
		return
	}
	ov, _, err := readOverlay(t)
	if err != nil {
		a.lg.Printf("overlay: %v", err)
		return
	}
	ov.OneWay = a.ov.Load().OneWay // an option, not a device setting
	if ov.cfg() != a.ov.Load().cfg() {
		if err := a.p.PrgFastpathCfg.Put(uint32(0), ov.cfg()); err != nil {
			a.lg.Printf("write config: %v", err)
			return
		}
		n := a.forget(func(fpFpKey, *fpFpFlow) bool { return true })
		a.lg.Printf("overlay changed (%s mtu %d vtep %s port %d vni %d): config rewritten, forgot %d flows",
			ov.VX.Dev, ov.MTU, ov.VTEP, ov.Port, ov.VNI, n)
		a.ov.Store(ov)
	}
	eps, _ := endpoints.Discover(t, []endpoints.VXLAN{ov.VX})
	rep, err := endpoints.Sync(a.p.tables(), eps, time.Now())
	if err != nil {
		a.lg.Printf("endpoints: %v", err)
	}
	if len(rep.Changed) > 0 {
		changed := map[uint32]bool{}
		for _, k := range rep.Changed {
			if k.Family == 4 {
				changed[k.Addr[0]] = true
			}
		}
		n := a.forget(func(k fpFpKey, _ *fpFpFlow) bool { return changed[k.Local] })
		a.lg.Printf("endpoints: %d live, %d added, %d updated, %d gone: forgot %d flows", rep.Live, rep.Added, rep.Updated, rep.Gone, n)
	}
	if n, err := attachPods(a.p, a.target, ov, eps); err != nil {
		a.lg.Printf("attach: %v", err)
	} else if n > 0 {
		a.lg.Printf("programs attached to %d new pod veths", n)
	}
	pruneLinks(a.target, map[uint32]string{ov.VX.Inode: ov.VX.Dev.Netns})
}

// forget deletes the flows drop selects and returns how many.
func (a *agent) forget(drop func(fpFpKey, *fpFpFlow) bool) int {
	var k fpFpKey
	var f fpFpFlow
	var del []fpFpKey
	it := a.p.PrgFastpathFlow.Iterate()
	for it.Next(&k, &f) {
		if drop(k, &f) {
			del = append(del, k)
		}
	}
	n := 0
	for _, k := range del {
		if err := a.p.PrgFastpathFlow.Delete(k); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
			n++
		}
	}
	return n
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
	ov := a.ov.Load()
	return ns == a.target && ifindex == ov.Underlay.Ifindex || ns == ov.VX.Dev.Netns && ifindex == ov.VX.Dev.Ifindex
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
