package prism

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The node agent keeps the endpoint map current as containers come and go: it re-reads the
// topology on every link change in the VXLAN devices' namespaces (and every resyncEvery as a
// backstop) and syncs the maps. Correctness does not depend on it: the kernel drops a vanished
// veth's devmap slot by itself, so a stale entry can only drop, never misdeliver.
//
// It is this same binary run as `peregrine agent prism --target NS`, detached, with its log
// under AgentLogDir.

// AgentLogDir holds the agents' logs.
var AgentLogDir = "/run/peregrine"

const (
	agentEnv    = "PEREGRINE_PRISM_AGENT"
	resyncEvery = 2 * time.Second
)

// AgentLog is the log file of the agent for a target.
func AgentLog(target string) string {
	return filepath.Join(AgentLogDir, "prism-agent-"+filepath.Base(datapath.PinDir(target))+".log")
}

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
		cur, err := datapath.LoadState(target, "prism")
		if err != nil || cur == nil || cur.Mode != "prism" {
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

func startAgent(target string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("prism: find own binary to start the agent: %w", err)
	}
	if err := os.MkdirAll(AgentLogDir, 0o755); err != nil {
		return 0, err
	}
	logf, err := os.OpenFile(AgentLog(target), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("prism: agent log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(exe, "agent", "prism", "--target", target)
	cmd.Env = append(os.Environ(), agentEnv+"="+target)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("prism: start agent: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	return cmd.Process.Pid, nil
}

// isAgent tells whether pid is (still) prism's agent for target, so a recycled PID is never
// signalled.
func isAgent(pid int, target string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 5 || args[1] != "agent" || args[2] != "prism" || args[3] != "--target" || args[4] != target {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	return true
}

func stopAgent(pid int, target string) error {
	if !isAgent(pid, target) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if !isAgent(pid, target) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	time.Sleep(50 * time.Millisecond)
	if isAgent(pid, target) {
		return errors.New("prism: agent does not stop")
	}
	return nil
}

// RunAgentIfAsked runs the agent and exits when this process was started as one. Test binaries
// that attach prism call it first thing in TestMain (their os.Executable is the test binary).
func RunAgentIfAsked() {
	target, ok := os.LookupEnv(agentEnv)
	if !ok {
		return
	}
	if err := runAgent(context.Background(), target); err != nil {
		fmt.Fprintf(os.Stderr, "prism agent: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}
