package ezpath

import (
	"os"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
)

func TestMain(m *testing.M) {
	agentproc.RunIfAgent() // attach starts the controller from this test binary
	os.Exit(m.Run())
}
