package agentproc

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// A record without an agent, or whose PID is not (or no longer) the mode's agent, is never
// signalled and reads as such in status.
func TestAgentKitWithoutAnAgent(t *testing.T) {
	testutil.Set(t, &datapath.AgentLogDir, t.TempDir())
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

// Run hands the body the record and ends normally when the record goes; an agent started for a
// target without a record refuses to run.
func TestAgentKitRun(t *testing.T) {
	testutil.Set(t, &datapath.StateDir, t.TempDir())
	const a = Agent("prg-kitmode")
	ctx := context.Background()
	if err := a.Run(ctx, "prg-kit-h1", 0, func(context.Context, *datapath.State, datapath.Logger) error {
		t.Fatal("body ran without a record")
		return nil
	}); !errors.Is(err, datapath.ErrNotAttached) {
		t.Fatalf("no record: %v", err)
	}
	if err := datapath.SaveState(&datapath.State{Mode: "prg-kitmode", Target: "prg-kit-h1", PID: 7}); err != nil {
		t.Fatal(err)
	}
	var got int
	err := a.Run(ctx, "prg-kit-h1", 0, func(_ context.Context, st *datapath.State, _ datapath.Logger) error {
		got = st.PID
		return datapath.ErrNotAttached
	})
	if err != nil || got != 7 {
		t.Fatalf("detached while running: %v (record pid %d)", err, got)
	}
	boom := errors.New("boom")
	if err := a.Run(ctx, "prg-kit-h1", 0, func(context.Context, *datapath.State, datapath.Logger) error { return boom }); err != boom {
		t.Fatalf("failing body: %v", err)
	}
}
