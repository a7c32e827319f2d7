//go:build peregrine_crashtest

package datapath

import (
	"fmt"
	"os"
)

// crashPoint lets the integration tests kill attach at a chosen step, to prove that detach
// from a new process restores everything. It exists only in test builds (the tag
// peregrine_crashtest, which cmd/peregrine's end-to-end tests pass when they build the binary)
// and does nothing unless PEREGRINE_CRASH_AT names the point.
func crashPoint(name string) {
	if os.Getenv("PEREGRINE_CRASH_AT") == name {
		fmt.Fprintf(os.Stderr, "peregrine: simulated crash at %s (PEREGRINE_CRASH_AT)\n", name)
		os.Exit(99)
	}
}
