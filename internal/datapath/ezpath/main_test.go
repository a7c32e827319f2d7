package ezpath

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
)

// The tests attach modes whose agents are started as this test binary.
func TestMain(m *testing.M) { agentproc.TestMain(m) }
