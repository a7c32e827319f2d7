package agentproc

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// A record without an agent, or whose PID is not (or no longer) the mode's agent, is never
// signalled and reads as such in status.
func TestAgentKitWithoutAnAgent(t *testing.T) {
	old := LogDir
	LogDir = t.TempDir()
	t.Cleanup(func() { LogDir = old })
	const a = Agent("prg-kitmode")
	none := &datapath.State{Mode: "prg-kitmode", Target: "prg-kit-h1"}
	if s := a.Status(none); s != "off" {
		t.Fatalf("no agent: status %q", s)
	}
	if err := a.Stop(none); err != nil {
		t.Fatal(err)
	}
	// This test process is alive but is not an agent: it must not be stopped or called running.
	other := &datapath.State{Mode: "prg-kitmode", Target: "prg-kit-h1", AgentPID: os.Getpid()}
	if a.Running(other) {
		t.Fatal("the test process taken for an agent")
	}
	if s := a.Status(other); !strings.Contains(s, "not running (log "+a.Log("prg-kit-h1")+")") {
		t.Fatalf("status %q", s)
	}
	if err := a.Stop(other); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.Log("prg-kit-h1"), []byte("bad config: no CPUs\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := a.WaitReady(context.Background(), other, time.Second, func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "exited at start") || !strings.Contains(err.Error(), "bad config: no CPUs") {
		t.Fatalf("an agent that is gone: %v", err)
	}
	if err := a.WaitReady(context.Background(), other, time.Second, func() bool { return true }); err != nil {
		t.Fatalf("ready at once: %v", err)
	}
}
