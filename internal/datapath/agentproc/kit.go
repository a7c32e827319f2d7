package agentproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Agent is the node agent of one mode, as a mode uses it: `const agent = agentproc.Agent(Name)`
// and then agent.Start(st), agent.Stop(st), agent.Status(st)... instead of wrapping Start, Is and
// Stop with its name again.
type Agent string

// Log is the agent's log file for target.
func (a Agent) Log(target string) string { return Log(string(a), target) }

// Start starts the agent for st.Target, detached, and records its PID in st (the caller or the
// framework saves the record).
func (a Agent) Start(st *datapath.State) error {
	if Hosting() {
		return startHosted(string(a), st)
	}
	pid, err := Start(string(a), st.Target)
	if err != nil {
		return err
	}
	st.AgentPID = pid
	return nil
}

// Stop stops st's agent; nil when st has none or it is no longer running.
func (a Agent) Stop(st *datapath.State) error {
	switch {
	case st.AgentPID <= 0:
		return nil
	case st.AgentInNode && st.AgentPID == os.Getpid():
		return stopHosted(string(a), st.Target)
	case st.AgentInNode:
		// The node agent hosts it: never signal the node agent; its hosted body ends by
		// itself once the record is gone.
		return nil
	}
	return Stop(st.AgentPID, string(a), st.Target)
}

// Running tells whether st's agent is alive (a recycled PID is not).
func (a Agent) Running(st *datapath.State) bool {
	if st.AgentInNode {
		if st.AgentPID == os.Getpid() {
			running, _ := HostedErr(string(a), st.Target)
			return running
		}
		return NodeAgentRunning(st.AgentPID, st.Target)
	}
	return Is(st.AgentPID, string(a), st.Target)
}

// Status is the agent's part of a status line: "off" (attached without one), "pid N, running"
// or "pid N, not running (log FILE)".
func (a Agent) Status(st *datapath.State) string {
	switch {
	case st.AgentPID <= 0:
		return "off"
	case st.AgentInNode && a.Running(st):
		return fmt.Sprintf("in the node agent (pid %d), running", st.AgentPID)
	case st.AgentInNode:
		return fmt.Sprintf("in the node agent (pid %d), not running: start the node agent again (it adopts the attachment)", st.AgentPID)
	case a.Running(st):
		return fmt.Sprintf("pid %d, running", st.AgentPID)
	default:
		return fmt.Sprintf("pid %d, not running (log %s)", st.AgentPID, a.Log(st.Target))
	}
}

// WaitReady waits up to within for ready after Start (so attach returns with the mode live). It
// fails at once, with the end of the agent's log, when the agent exits first.
func (a Agent) WaitReady(ctx context.Context, st *datapath.State, within time.Duration, ready func() bool) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if ready() {
			return nil
		}
		if !a.Running(st) {
			return fmt.Errorf("%s: agent %d exited at start; its log %s ends: %s", a, st.AgentPID, a.Log(st.Target), LogTail(string(a), st.Target))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: agent %d not ready after %s; its log %s: %s", a, st.AgentPID, within, a.Log(st.Target), LogTail(string(a), st.Target))
}

// Run is an agent's whole run (a mode's RunAgent): body gets a context that SIGTERM or SIGINT
// (detach, ^C) ends, the mode's record on target (waiting up to wait for it: the attaching
// process may not have written it yet) and the agent's logger (slog, every line tagged
// mode=MODE target=TARGET: the runtime's logger when the node agent hosts the agent, else a text
// handler on stderr, which Start points at the log file). A body that returns nil (its context
// ended) or ErrNotAttached (the record went: detached) stops the agent normally.
func (a Agent) Run(ctx context.Context, target string, wait time.Duration,
	body func(context.Context, *datapath.State, datapath.Logger) error) error {
	// Hosted by the node agent, which handles the signals and the log (the runtime's logger; its
	// other lines name the target in full); detached, the log file is the agent's own (the short
	// label is enough).
	sl := datapath.CurrentRuntime().Log.With("mode", string(a), "target", target)
	if !inNode(ctx) {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		sl = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("mode", string(a), "target", netnsutil.Label(target))
	}
	lg := datapath.NewLogger(sl)
	st, err := datapath.Attached(target, string(a), wait)
	if err != nil {
		return err
	}
	switch err := body(ctx, st, lg); {
	case errors.Is(err, datapath.ErrNotAttached):
		lg.Printf("attachment gone, stopping")
	case err != nil:
		return err
	default:
		lg.Printf("stopping")
	}
	return nil
}

// RunIfAgent runs the agent and exits when this process was started as the agent of a
// registered mode (datapath.AgentRunner). Test binaries that attach modes with agents call it
// first thing in TestMain: their os.Executable is the test binary, not the CLI.
func RunIfAgent() {
	for _, m := range datapath.Modes() {
		if r, ok := m.(datapath.AgentRunner); ok {
			RunIfAsked(m.Name(), r.RunAgent)
		}
	}
}
