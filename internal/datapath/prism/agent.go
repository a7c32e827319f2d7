package prism

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The node agent keeps the endpoint map current as containers come and go: it re-reads the
// topology on every link change in the VXLAN devices' namespaces (and every resyncEvery as a
// backstop) and syncs the maps. Correctness does not depend on it: the kernel drops a vanished
// veth's devmap slot by itself, so a stale entry can only drop, never misdeliver.
//
// It is this same binary run as `peregrine agent prism --target=NS`, detached (see
// internal/datapath/agentproc).

const resyncEvery = 2 * time.Second

// AgentLog is the log file of the agent for a target.
func AgentLog(target string) string { return agentproc.Log(Name, target) }

// RunAgent implements datapath.AgentRunner.
func (mode) RunAgent(ctx context.Context, target string) error { return runAgent(ctx, target) }

func runAgent(ctx context.Context, target string) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	lg := log.New(os.Stderr, "prism-agent["+label(target)+"] ", log.LstdFlags|log.Lmicroseconds)
	st, err := prismState(target)
	if err != nil {
		return err
	}
	objs, err := openPinned(target)
	if err != nil {
		return err
	}
	defer objs.Close()
	events := make(chan struct{}, 1)
	watched := map[string]bool{}
	for _, d := range st.Topology.ByStage(datapath.StageVXLAN) {
		if watched[d.Netns] {
			continue
		}
		watched[d.Netns] = true
		if err := watchLinks(ctx, d.Netns, events); err != nil {
			lg.Printf("no link events from %s (resyncing every %s instead): %v", label(d.Netns), resyncEvery, err)
		}
	}
	lg.Printf("started")
	tick := time.NewTicker(resyncEvery)
	defer tick.Stop()
	for {
		cur, err := datapath.LoadState(target, Name)
		if err != nil || cur == nil || cur.Mode != Name {
			lg.Printf("attachment gone, stopping")
			return nil
		}
		if rep, err := resync(cur, objs); err != nil {
			lg.Printf("sync: %v", err)
		} else if rep.Added+rep.Updated+rep.Gone+rep.Expired > 0 {
			lg.Printf("endpoints: %d live, %d added, %d updated, %d gone, %d expired", rep.Live, rep.Added, rep.Updated, rep.Gone, rep.Expired)
		}
		select {
		case <-ctx.Done():
			lg.Printf("stopping")
			return nil
		case <-events:
			// A burst of events (a container with several links) settles first.
			time.Sleep(20 * time.Millisecond)
		case <-tick.C:
		}
	}
}

// resync re-discovers the endpoints behind the recorded VXLAN devices and syncs the maps.
func resync(st *datapath.State, objs *objects) (syncReport, error) {
	t, err := datapath.Discover(st.Target, st.Options["underlay"])
	if err != nil {
		return syncReport{}, err
	}
	vxs, err := discoverVXLAN(t)
	if err != nil {
		return syncReport{}, err
	}
	eps, _ := discoverEndpoints(t, vxs)
	return syncEndpoints(objs, eps, time.Now())
}

// Sync brings the endpoint map of target up to date once (what the agent does continuously).
func Sync(target string) (added, updated, gone int, err error) {
	st, err := prismState(target)
	if err != nil {
		return 0, 0, 0, err
	}
	objs, err := openPinned(target)
	if err != nil {
		return 0, 0, 0, err
	}
	defer objs.Close()
	rep, err := resync(st, objs)
	return rep.Added, rep.Updated, rep.Gone, err
}

// watchLinks signals events on every link change in namespace ns until ctx ends.
func watchLinks(ctx context.Context, ns string, events chan<- struct{}) error {
	h, err := netnsutil.Handle(ns)
	if err != nil {
		return err
	}
	ch := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	if err := netlink.LinkSubscribeAt(h, ch, done); err != nil {
		h.Close()
		return err
	}
	go func() {
		defer h.Close()
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-ch:
				if !ok {
					return
				}
				select {
				case events <- struct{}{}:
				default:
				}
			}
		}
	}()
	return nil
}

func startAgent(target string) (int, error)  { return agentproc.Start(Name, target) }
func isAgent(pid int, target string) bool    { return agentproc.Is(pid, Name, target) }
func stopAgent(pid int, target string) error { return agentproc.Stop(pid, Name, target) }

// RunAgentIfAsked runs the agent and exits when this process was started as one. Test binaries
// that attach prism call it first thing in TestMain (their os.Executable is the test binary).
func RunAgentIfAsked() { agentproc.RunIfAsked(Name, runAgent) }
