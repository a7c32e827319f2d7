package datapath

import (
	"context"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

type fakeMode struct{ name string }

func (f fakeMode) Name() string                                         { return f.name }
func (fakeMode) Summary() string                                        { return "a test mode" }
func (fakeMode) Options() *option.Schema                                { return nil }
func (fakeMode) Knobs(*Topology, Options) ([]Knob, error)               { return nil, nil }
func (fakeMode) Load(context.Context, *Topology, Options, *State) error { return nil }
func (fakeMode) Unload(context.Context, *State) error                   { return nil }

var _ Mode = fakeMode{}

// A second mode of a name already registered panics, naming the name, and leaves the first.
func TestRegisterRefusesDuplicate(t *testing.T) {
	name := "prg-test-dup"
	first := fakeMode{name: name}
	Register(first)
	t.Cleanup(func() { delete(modes, name) })
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("a second Register of the same name did not panic")
		}
		if msg, _ := r.(string); !strings.Contains(msg, `"prg-test-dup" registered twice`) {
			t.Errorf("panic %v does not name the mode", r)
		}
		if m, err := Lookup(name); err != nil || m != Mode(first) {
			t.Errorf("after the refused Register: %v, %v (want the first mode)", m, err)
		}
	}()
	Register(fakeMode{name: name})
}
