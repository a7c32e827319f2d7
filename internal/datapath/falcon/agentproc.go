package falcon

import (
	"context"
	"fmt"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
)

// The agent is this same binary run as `peregrine agent falcon --target=NS`, detached; see
// internal/datapath/agentproc.

// AgentLog is the log file of the agent for a target.
func AgentLog(target string) string { return agentproc.Log(Name, target) }

func startAgent(target string) (int, error)  { return agentproc.Start(Name, target) }
func isAgent(pid int, target string) bool    { return agentproc.Is(pid, Name, target) }
func stopAgent(pid int, target string) error { return agentproc.Stop(pid, Name, target) }
func logTail(target string) string           { return agentproc.LogTail(Name, target) }

// waitAgentReady waits for the agent's first gate update, so attach returns with falcon live.
func waitAgentReady(ctx context.Context, o *objects, pid int, target string) error {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if g, err := o.readGate(); err == nil && g.UpdatedNs != 0 {
			return nil
		}
		if !isAgent(pid, target) {
			return fmt.Errorf("falcon: agent %d exited at start; its log %s ends: %s", pid, AgentLog(target), logTail(target))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("falcon: agent %d wrote no load sample in 5 s; log %s: %s", pid, AgentLog(target), logTail(target))
}

// RunAgentIfAsked runs the agent and exits when this process was started as one. Test binaries
// that attach falcon call it first thing in TestMain (their os.Executable is the test binary).
func RunAgentIfAsked() { agentproc.RunIfAsked(Name, runAgent) }
