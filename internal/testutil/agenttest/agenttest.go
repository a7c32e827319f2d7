// Package agenttest is the TestMain of test packages that attach modes with agents. It is
// test-only (it imports testing) and lives here rather than in agentproc so that the production
// packages carry no test scaffolding.
package agenttest

import (
	"os"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
)

// Main is such a package's TestMain: a process the tests started as a mode's agent (the test
// binary is its os.Executable, not the CLI) runs the agent and exits (agentproc.RunIfAgent);
// otherwise the binary runs the tests.
func Main(m *testing.M) {
	agentproc.RunIfAgent()
	os.Exit(m.Run())
}
