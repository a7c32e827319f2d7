package falcon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// The agent is this same binary run as `peregrine agent falcon --target NS`, detached (its own
// session, output to a log under /run/peregrine), so it outlives the CLI that attached.

// AgentLogDir holds the agents' logs.
var AgentLogDir = "/run/peregrine"

// agentEnv marks a process started as falcon's agent. A test binary (which is not the peregrine
// CLI) checks it in TestMain through RunAgentIfAsked; the CLI ignores it and parses its args.
const agentEnv = "PEREGRINE_FALCON_AGENT"

// AgentLog is the log file of the agent for a target.
func AgentLog(target string) string {
	return filepath.Join(AgentLogDir, "falcon-agent-"+filepath.Base(datapath.PinDir(target))+".log")
}

func startAgent(target string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("falcon: find own binary to start the agent: %w", err)
	}
	if err := os.MkdirAll(AgentLogDir, 0o755); err != nil {
		return 0, err
	}
	logf, err := os.OpenFile(AgentLog(target), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("falcon: agent log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(exe, "agent", "falcon", "--target="+target)
	cmd.Env = append(os.Environ(), agentEnv+"="+target)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("falcon: start agent: %w", err)
	}
	// Reap it if it ends while we live (tests attach and detach in one process); once we exit,
	// init adopts it.
	go func() { _ = cmd.Wait() }()
	return cmd.Process.Pid, nil
}

// isAgent tells whether pid is (still) falcon's agent for target, so a recycled PID is never
// signalled.
func isAgent(pid int, target string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 4 || args[1] != "agent" || args[2] != "falcon" || args[3] != "--target="+target {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited: nothing left to stop.
	if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	return true
}

// stopAgent asks the agent to stop (SIGTERM) and waits; SIGKILL after 3 s.
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
		return fmt.Errorf("falcon: agent %d for %s does not stop", pid, target)
	}
	return nil
}

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

func logTail(target string) string {
	// Let a dying agent's last words reach the file before reading it.
	time.Sleep(100 * time.Millisecond)
	b, _ := os.ReadFile(AgentLog(target))
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return strings.TrimSpace(string(b))
}

// RunAgentIfAsked runs the agent and exits when this process was started as one. Test binaries
// that attach falcon call it first thing in TestMain (their os.Executable is the test binary).
func RunAgentIfAsked() {
	target, ok := os.LookupEnv(agentEnv)
	if !ok {
		return
	}
	if err := runAgent(context.Background(), target); err != nil {
		fmt.Fprintf(os.Stderr, "falcon agent: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}
