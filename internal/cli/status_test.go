package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/agent"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/safefile"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// TestStatusJSONListsNodeAgents: `status --json` is one object with both lists, the node agents
// included (with whether each still runs), where it used to print only the attachments.
func TestStatusJSONListsNodeAgents(t *testing.T) {
	testutil.RequireRoot(t) // the records are root's alone
	oldState, oldAgents := datapath.StateDir, datapath.NodeAgentDir
	dir := t.TempDir()
	datapath.StateDir, datapath.NodeAgentDir = filepath.Join(dir, "datapath"), filepath.Join(dir, "agent")
	t.Cleanup(func() { datapath.StateDir, datapath.NodeAgentDir = oldState, oldAgents })

	run := func() (out struct {
		NodeAgents []struct {
			Target  string `json:"target"`
			Running bool   `json:"running"`
		} `json:"node_agents"`
		Attachments []json.RawMessage `json:"attachments"`
	}) {
		c := newStatusCmd()
		var b bytes.Buffer
		c.SetOut(&b)
		c.SetArgs([]string{"--json"})
		if err := c.Execute(); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b.Bytes(), &out); err != nil {
			t.Fatalf("status --json does not decode: %v\n%s", err, b.String())
		}
		if out.NodeAgents == nil || out.Attachments == nil {
			t.Fatalf("a list is null, want [] when empty:\n%s", b.String())
		}
		return out
	}
	if got := run(); len(got.NodeAgents) != 0 || len(got.Attachments) != 0 {
		t.Fatalf("empty state dirs: %+v", got)
	}

	// A live agent (fresh heartbeat) and a dead one (PID gone, heartbeat long past).
	for _, s := range []agent.Status{
		{PID: 1 << 22, Target: "prg-status-live", Updated: time.Now(), Interval: time.Minute},
		{PID: 1 << 22, Target: "prg-status-dead", Updated: time.Now().Add(-time.Hour), Interval: time.Second},
	} {
		b, _ := json.Marshal(s)
		if err := safefile.WriteFile(datapath.NodeAgentStatus(s.Target), b); err != nil {
			t.Fatal(err)
		}
	}
	running := map[string]bool{}
	for _, a := range run().NodeAgents {
		running[a.Target] = a.Running
	}
	if len(running) != 2 || !running["prg-status-live"] || running["prg-status-dead"] {
		t.Errorf("node agents %v, want prg-status-live running and prg-status-dead not", running)
	}
}
