package agentproc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// A symlink planted where an agent's log goes (the old recipe mounted /run/peregrine into
// containers) is refused: root's agent would have appended to whatever it points at.
func TestAgentLogRefusesPlantedSymlink(t *testing.T) {
	old := datapath.AgentLogDir
	datapath.AgentLogDir = filepath.Join(t.TempDir(), "agents")
	t.Cleanup(func() { datapath.AgentLogDir = old })
	if err := os.Mkdir(datapath.AgentLogDir, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, Log("prgtest", "prg-x-h1")); err != nil {
		t.Fatal(err)
	}
	pid, err := Start("prgtest", "prg-x-h1")
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Start with a planted log link: pid %d, err %v; want a refusal", pid, err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the link's target was written: %q", b)
	}
}
