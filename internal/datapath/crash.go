package datapath

import (
	"fmt"
	"os"
)

// crashPoint lets the integration tests kill attach at a chosen step, to prove that detach
// from a new process restores everything. It does nothing unless PEREGRINE_CRASH_AT names
// the point; it is never set in normal use.
func crashPoint(name string) {
	if os.Getenv("PEREGRINE_CRASH_AT") == name {
		fmt.Fprintf(os.Stderr, "peregrine: simulated crash at %s (PEREGRINE_CRASH_AT)\n", name)
		os.Exit(99)
	}
}
