package ezpath

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
)

// The tests attach modes whose agents are started as this test binary; their racks are labs,
// as the CLI's are.
func TestMain(m *testing.M) {
	datapath.UseRuntime(datapath.Runtime{OpenRack: func(name string) (Rack, error) {
		r, err := lab.OpenRack(name)
		if err != nil {
			return nil, err
		}
		return r, nil
	}})
	agenttest.Main(m)
}
