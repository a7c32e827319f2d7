package datapath

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"time"
)

// The mode kit: what every mode needs around its programs (its pin directory, its part of the
// record, the record itself) in one place, so a mode configures these rather than copying them.
// Agents are in agentproc (Agent), the netlink watch loop in watch.go, labels in
// netnsutil.Label.

// ModePinDir is where mode pins its objects for target: its own directory under PinDir(target),
// so modes stacked on one target never meet in the pins.
func ModePinDir(target, mode string) string { return filepath.Join(PinDir(target), mode) }

// LoadModeState decodes the mode's own part of a record; the zero T when the record has none
// yet (an attach that crashed before recording anything).
func LoadModeState[T any](st *State) (T, error) {
	var v T
	if len(st.ModeState) == 0 {
		return v, nil
	}
	if err := json.Unmarshal(st.ModeState, &v); err != nil {
		return v, fmt.Errorf("%s: the record's mode state is corrupt: %w", st.Mode, err)
	}
	return v, nil
}

// SetModeState puts v in the record as the mode's own part, in memory: the framework (or
// UpdateState) writes the record afterwards. A value that cannot be encoded is a bug in the
// mode's types, not an input error, so it panics rather than record half a state.
func SetModeState[T any](st *State, v T) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("%s: encode mode state: %v", st.Mode, err))
	}
	st.ModeState = b
}

// SaveModeState puts v in the record and writes the record: progress that a crash from here on
// leaves for detach to undo.
func SaveModeState[T any](st *State, v T) error {
	SetModeState(st, v)
	return SaveState(st)
}

// RecordThenCreate is the order every mode follows for what it creates outside the record (a pin
// directory under bpffs): the path goes into the record's Pins and the record is written first,
// then create makes it. A crash at any point leaves a record that names everything made, and
// detach removes what is named (a path never made is no error); the other order would leave, after
// a crash between the two steps, a pin nobody knows of. A failing create leaves the path recorded
// for the same reason: it may have made part of it.
func RecordThenCreate(st *State, pin string, create func() error) error {
	if !slices.Contains(st.Pins, pin) {
		st.Pins = append(st.Pins, pin)
	}
	if err := SaveState(st); err != nil {
		return err
	}
	return create()
}

// Attached loads the record of mode on target, with an error that says how to attach when there
// is none; wait > 0 waits that long for a record that is not there yet (an agent started by an
// attach whose write may not be visible to it at once).
func Attached(target, mode string, wait time.Duration) (*State, error) {
	deadline := time.Now().Add(wait)
	for {
		st, err := LoadState(target, mode)
		if err != nil {
			return nil, err
		}
		if st != nil && st.Mode == mode {
			return st, nil
		}
		if !time.Now().Before(deadline) {
			return nil, NotAttached(target, mode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LoadAttached is Attached (without waiting) and LoadModeState of its record together.
func LoadAttached[T any](target, mode string) (*State, T, error) {
	st, err := Attached(target, mode, 0)
	if err != nil {
		var zero T
		return nil, zero, err
	}
	ms, err := LoadModeState[T](st)
	return st, ms, err
}

// NotAttached is the error for a mode that is not attached to target (it wraps ErrNotAttached).
func NotAttached(target, mode string) error {
	return fmt.Errorf("%s is not attached to %s (run `peregrine attach %s`): %w", mode, nsLabel(target), mode, ErrNotAttached)
}

// StageSteererOn names a mode attached to target that steers the later stages ("" if none).
func StageSteererOn(target string) (string, error) {
	sts, err := LoadStates(target)
	if err != nil {
		return "", err
	}
	for _, st := range sts {
		if m, ok := modes[st.Mode]; ok {
			if _, ok := m.(StageSteerer); ok {
				return st.Mode, nil
			}
		}
	}
	return "", nil
}
