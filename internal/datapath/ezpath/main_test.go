package ezpath

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	RunAgentIfAsked() // attach starts the controller from this test binary
	os.Exit(m.Run())
}
