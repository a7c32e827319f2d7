package agentproc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/proc"
)

// The node agent (`peregrine agent --config`, internal/agent) hosts the modes' agents: once it
// calls Host, Agent.Start runs a mode's agent body in a goroutine of this process instead of a
// detached `peregrine agent MODE` process, and records the node agent's PID with AgentInNode.
// Stop then ends the goroutine (in the node agent) or, from another process (a CLI detach
// --force), signals nothing: the hosted body sees its record gone and ends by itself.

type hostedRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // the body's error once done
}

var host struct {
	mu   sync.Mutex
	ctx  context.Context // nil while this process hosts nothing
	runs map[string]*hostedRun
}

func hostKey(mode, target string) string { return mode + "\x00" + target }

// Host makes this process the node agent: from now on Agent.Start runs agents in it. The
// hosted agents end with ctx.
func Host(ctx context.Context) {
	host.mu.Lock()
	defer host.mu.Unlock()
	host.ctx, host.runs = ctx, map[string]*hostedRun{}
}

// Hosting tells whether this process is the node agent.
func Hosting() bool {
	host.mu.Lock()
	defer host.mu.Unlock()
	return host.ctx != nil
}

type inNodeKey struct{}

func inNode(ctx context.Context) bool { return ctx.Value(inNodeKey{}) != nil }

// startHosted runs mode's agent body for st in a goroutine of the node agent.
func startHosted(mode string, st *datapath.State) error {
	m, err := datapath.Lookup(mode)
	if err != nil {
		return err
	}
	r, ok := m.(datapath.AgentRunner)
	if !ok {
		return fmt.Errorf("mode %s has no agent", mode)
	}
	host.mu.Lock()
	defer host.mu.Unlock()
	if host.ctx == nil {
		return fmt.Errorf("%s: this process is not the node agent", mode)
	}
	k := hostKey(mode, st.Target)
	if old := host.runs[k]; old != nil {
		select {
		case <-old.done:
		default:
			st.AgentPID, st.AgentInNode = os.Getpid(), true
			return nil // already running here (an adopted attachment)
		}
	}
	ctx, cancel := context.WithCancel(context.WithValue(host.ctx, inNodeKey{}, true))
	run := &hostedRun{cancel: cancel, done: make(chan struct{})}
	host.runs[k] = run
	go func() {
		defer close(run.done)
		run.err = r.RunAgent(ctx, st.Target)
		if run.err != nil {
			slog.Error("mode agent stopped", "mode", mode, "target", st.Target, "err", run.err)
		}
	}()
	st.AgentPID, st.AgentInNode = os.Getpid(), true
	return nil
}

// HostedErr is how a hosted agent ended: running false while it has not; err nil when it ended
// normally (its attachment went).
func HostedErr(mode, target string) (running bool, err error) {
	host.mu.Lock()
	run := host.runs[hostKey(mode, target)]
	host.mu.Unlock()
	if run == nil {
		return false, nil
	}
	select {
	case <-run.done:
		return false, run.err
	default:
		return true, nil
	}
}

// stopHosted ends a hosted agent and waits for it (3 s at most).
func stopHosted(mode, target string) error {
	host.mu.Lock()
	k := hostKey(mode, target)
	run := host.runs[k]
	delete(host.runs, k)
	host.mu.Unlock()
	if run == nil {
		return nil
	}
	run.cancel()
	select {
	case <-run.done:
		return nil
	case <-time.After(3 * time.Second):
		return fmt.Errorf("%s: the agent for %s does not stop", mode, target)
	}
}

// IsNodeAgent tells whether pid is a running node agent (`peregrine agent --config ...`),
// this process included.
func IsNodeAgent(pid int) bool {
	if pid <= 0 {
		return false
	}
	if pid == os.Getpid() {
		return Hosting()
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || proc.Gone(pid) {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 2 || args[1] != "agent" {
		return false
	}
	for _, a := range args[2:] {
		if a == "--config" || strings.HasPrefix(a, "--config=") {
			return true
		}
	}
	return false
}

// NodeAgentRunning tells whether the node agent with pid, managing target, runs: as the
// process's datapath.Runtime says (the CLI's adds the node agent's status file heartbeat, for an
// agent in another PID namespace, where pid means nothing), by the PID alone without one.
func NodeAgentRunning(pid int, target string) bool {
	if f := datapath.CurrentRuntime().NodeAgentRunning; f != nil {
		return f(pid, target)
	}
	return IsNodeAgent(pid)
}

// Adopt makes the node agent host the agent of an existing attachment (one it finds recorded
// at start): a detached per-mode agent of it is stopped first (it is not the node agent, so
// signalling it is safe), then the body runs here and the record says so. An attachment
// without an agent (attached with agent=false) stays without one.
func Adopt(st *datapath.State) error {
	if st.AgentPID <= 0 {
		return nil
	}
	switch {
	case st.AgentInNode && st.AgentPID != os.Getpid() && IsNodeAgent(st.AgentPID):
		return fmt.Errorf("%s on %s: another node agent (pid %d) runs its agent: stop it first", st.Mode, st.Target, st.AgentPID)
	case !st.AgentInNode:
		if err := Stop(st.AgentPID, st.Mode, st.Target); err != nil {
			return err
		}
	}
	if err := startHosted(st.Mode, st); err != nil {
		return err
	}
	return datapath.UpdateState(st.Target, st.Mode, 3*time.Second, func(cur *datapath.State) error {
		cur.AgentPID, cur.AgentInNode = st.AgentPID, st.AgentInNode
		return nil
	})
}

// StopHosting ends every hosted agent (the node agent is exiting) and waits for them, up to
// within; the attachments and their records stay.
func StopHosting(within time.Duration) {
	host.mu.Lock()
	runs := host.runs
	host.runs, host.ctx = nil, nil
	host.mu.Unlock()
	deadline := time.After(within)
	for _, r := range runs {
		r.cancel()
	}
	for _, r := range runs {
		select {
		case <-r.done:
		case <-deadline:
			return
		}
	}
}
