package datapath

import (
	"github.com/peregrine-net/peregrine/internal/datapath/option"

	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// tempState points the records at a fresh directory for one test.
func tempState(t *testing.T) { testutil.Set(t, &StateDir, t.TempDir()) }

type kitState struct {
	Pieces []string `json:"pieces"`
	N      int      `json:"n"`
}

func TestModeStateRoundTrip(t *testing.T) {
	tempState(t)
	st := &State{Mode: "kitmode", Target: "prg-kit-h1"}
	if ms, err := LoadModeState[kitState](st); err != nil || ms.N != 0 || ms.Pieces != nil {
		t.Fatalf("empty record: %+v, %v; want the zero value", ms, err)
	}
	if err := SaveModeState(st, kitState{Pieces: []string{"a", "b"}, N: 2}); err != nil {
		t.Fatal(err)
	}
	back, err := LoadState("prg-kit-h1", "kitmode")
	if err != nil || back == nil {
		t.Fatalf("record not saved: %v", err)
	}
	ms, err := LoadModeState[kitState](back)
	if err != nil || ms.N != 2 || strings.Join(ms.Pieces, ",") != "a,b" {
		t.Fatalf("read back %+v, %v", ms, err)
	}
	if st, ms, err := LoadAttached[kitState]("prg-kit-h1", "kitmode"); err != nil || st.Target != "prg-kit-h1" || ms.N != 2 {
		t.Fatalf("LoadAttached: %+v, %v", ms, err)
	}
	if _, _, err := LoadAttached[kitState]("prg-kit-h9", "kitmode"); !errors.Is(err, ErrNotAttached) {
		t.Fatalf("LoadAttached of nothing: %v", err)
	}
	back.ModeState = []byte(`{"n": "two"}`)
	if _, err := LoadModeState[kitState](back); err == nil || !strings.Contains(err.Error(), "kitmode: the record's mode state is corrupt") {
		t.Fatalf("corrupt mode state: %v", err)
	}
}

func TestAttachedSaysHowToAttach(t *testing.T) {
	tempState(t)
	_, err := Attached("prg-kit-h2", "kitmode", 0)
	if !errors.Is(err, ErrNotAttached) || !strings.Contains(err.Error(), "kitmode is not attached to prg-kit-h2 (run `peregrine attach kitmode`)") {
		t.Fatalf("got %v", err)
	}
	// A record that appears while Attached waits is found.
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = SaveState(&State{Mode: "kitmode", Target: "prg-kit-h2"})
	}()
	st, err := Attached("prg-kit-h2", "kitmode", 2*time.Second)
	if err != nil || st.Target != "prg-kit-h2" {
		t.Fatalf("record written meanwhile: %+v, %v", st, err)
	}
}

func TestModePinDirIsPerMode(t *testing.T) {
	a, b := ModePinDir("prg-kit-h1", "one"), ModePinDir("prg-kit-h1", "two")
	if a == b || filepath.Dir(a) != PinDir("prg-kit-h1") || filepath.Base(b) != "two" {
		t.Fatalf("pin dirs %s and %s", a, b)
	}
}

type steerMode struct{ kitTestMode }

func (steerMode) SteersLaterStages() {}

type kitTestMode struct{ name string }

func (m kitTestMode) Name() string                                         { return m.name }
func (kitTestMode) Summary() string                                        { return "test" }
func (kitTestMode) Options() *option.Schema                                { return nil }
func (kitTestMode) Knobs(*Topology, Options) ([]Knob, error)               { return nil, nil }
func (kitTestMode) Load(context.Context, *Topology, Options, *State) error { return nil }
func (kitTestMode) Unload(context.Context, *State) error                   { return nil }

func TestStageSteererOn(t *testing.T) {
	tempState(t)
	Register(kitTestMode{"prg-kit-plain"})
	Register(steerMode{kitTestMode{"prg-kit-steer"}})
	t.Cleanup(func() { delete(modes, "prg-kit-plain"); delete(modes, "prg-kit-steer") })
	if err := SaveState(&State{Mode: "prg-kit-plain", Target: "prg-kit-h3"}); err != nil {
		t.Fatal(err)
	}
	if got, err := StageSteererOn("prg-kit-h3"); err != nil || got != "" {
		t.Fatalf("no steerer attached: got %q, %v", got, err)
	}
	if err := SaveState(&State{Mode: "prg-kit-steer", Target: "prg-kit-h3"}); err != nil {
		t.Fatal(err)
	}
	if got, err := StageSteererOn("prg-kit-h3"); err != nil || got != "prg-kit-steer" {
		t.Fatalf("steerer attached: got %q, %v", got, err)
	}
	if got, _ := StageSteererOn("prg-kit-h4"); got != "" {
		t.Fatalf("other target: got %q", got)
	}
}

// RecordThenCreate writes the record naming the pin before create runs; a failing create leaves
// the pin recorded (detach removes what it made); a failing save never creates; the same pin is
// recorded once.
func TestRecordThenCreate(t *testing.T) {
	tempState(t)
	testutil.Set(t, &PinRoot, t.TempDir())
	st := &State{Mode: "kitmode", Target: "prg-kit-h1"}
	pin := ModePinDir(st.Target, st.Mode)
	created := false
	err := RecordThenCreate(st, pin, func() error {
		back, err := LoadState("prg-kit-h1", "kitmode")
		if err != nil || back == nil || len(back.Pins) != 1 || back.Pins[0] != pin {
			t.Errorf("at create, the record on disk is %+v, %v: want it naming %s", back, err, pin)
		}
		created = true
		return errors.New("half made")
	})
	if !created || err == nil || err.Error() != "half made" {
		t.Fatalf("create ran %v, error %v: want it run and its error returned", created, err)
	}
	if back, _ := LoadState("prg-kit-h1", "kitmode"); back == nil || len(back.Pins) != 1 {
		t.Fatalf("after a failed create the record is %+v: want the pin still named", back)
	}
	if err := RecordThenCreate(st, pin, func() error { return nil }); err != nil || len(st.Pins) != 1 {
		t.Fatalf("the same pin again: %v, pins %v", err, st.Pins)
	}
	// a record that cannot be written: nothing is created
	testutil.Set(t, &StateDir, filepath.Join(t.TempDir(), "file"))
	if err := os.WriteFile(StateDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	called := false
	if err := RecordThenCreate(st, pin+"2", func() error { called = true; return nil }); err == nil || called {
		t.Fatalf("unwritable record: error %v, create called %v: want an error and no create", err, called)
	}
}
