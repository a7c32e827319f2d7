package ezpath

import (
	"os"
	"testing"

	"github.com/peregrine-net/peregrine/internal/lab"
)

func TestMain(m *testing.M) {
	UseRacks(func(name string) (Rack, error) { // as the CLI does: the tests' racks are labs
		r, err := lab.OpenRack(name)
		if err != nil {
			return nil, err
		}
		return r, nil
	})
	RunAgentIfAsked() // attach starts the controller from this test binary
	os.Exit(m.Run())
}
