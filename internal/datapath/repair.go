package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// What the node agent (internal/agent) asks of a live attachment on every reconcile: knobs
// that drifted are written again, pieces that vanished are put back, a changed config is applied
// live where the mode can (else the agent detaches and attaches that mode), and an attachment
// adopted from an older binary gets the newer programs.

// DriftedKnobs lists the knobs of st whose live value is not the one set. A knob whose device
// or namespace is gone has not drifted: it went with the device (the mode's agent follows).
func DriftedKnobs(st *State) []Knob {
	var out []Knob
	for _, k := range st.Knobs {
		if k.Netns != "" && !netnsutil.Exists(k.Netns) {
			continue
		}
		if deviceGone(k) {
			continue
		}
		if !SameValue(CurrentValue(k), k.New) {
			out = append(out, k)
		}
	}
	return out
}

// MissingPins lists the recorded pins of st that are gone (a generic check of the programs of a
// mode that is no Repairer).
func MissingPins(st *State) []string {
	var out []string
	for _, p := range st.Pins {
		if _, err := os.Stat(p); err != nil {
			out = append(out, p)
		}
	}
	return out
}

// SetManaged marks the record of mode on target as the node agent's (or not).
func SetManaged(target, mode string, managed bool) error {
	return UpdateState(target, mode, lockWait, func(st *State) error {
		st.Managed = managed
		return nil
	})
}

// SetConfig records cfg as the attachment's config (after a live change).
func SetConfig(target, mode string, cfg []byte) error {
	return UpdateState(target, mode, lockWait, func(st *State) error {
		if len(cfg) == 0 {
			return fmt.Errorf("%s: empty config", mode)
		}
		st.Config = cfg
		return nil
	})
}

// ErrNeedsReattach is wrapped by an Upgrader or LiveConfigurer that cannot change the
// attachment in place: the node agent detaches and attaches the mode instead.
var ErrNeedsReattach = errors.New("the mode must be detached and attached again")
