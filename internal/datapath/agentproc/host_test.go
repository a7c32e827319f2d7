package agentproc

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// This test binary started with PRG_TEST_NODE_AGENT set stands for a node agent
// (`... agent --config FILE`) that does nothing but live (the package's own TestMain is the
// helper modes' tests use, so this is an init).
func init() {
	if os.Getenv("PRG_TEST_NODE_AGENT") != "" {
		time.Sleep(30 * time.Second)
		os.Exit(0)
	}
}

// A record whose agent runs inside a node agent (another process) is never signalled by Stop,
// a CLI detach's: the node agent's hosted body ends by itself once the record is gone. Status
// and Running name the node agent.
func TestStopNeverSignalsTheNodeAgent(t *testing.T) {
	cmd := exec.Command(os.Args[0], "agent", "--config", "/nonexistent/prg-test.yaml")
	cmd.Env = append(os.Environ(), "PRG_TEST_NODE_AGENT=1")
	p, err := testutil.StartProc(t, cmd)
	if err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	time.Sleep(50 * time.Millisecond) // its cmdline is the exec'd one
	if !IsNodeAgent(pid) {
		t.Fatalf("pid %d (`agent --config`) not taken for a node agent", pid)
	}
	const a = Agent("prg-kitmode")
	st := &datapath.State{Mode: "prg-kitmode", Target: "prg-kit-h1", AgentPID: pid, AgentInNode: true}
	if !a.Running(st) || !strings.Contains(a.Status(st), "in the node agent (pid") {
		t.Fatalf("running %v, status %q", a.Running(st), a.Status(st))
	}
	if err := a.Stop(st); err != nil {
		t.Fatal(err)
	}
	if exited, _ := p.Wait(200 * time.Millisecond); exited {
		t.Fatal("Stop signalled the node agent")
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the node agent is gone: %v", err)
	}
	// The per-mode form of the same PID is not this mode's agent either: never signalled.
	st.AgentInNode = false
	if a.Running(st) {
		t.Fatal("a node agent taken for a per-mode agent")
	}
}
