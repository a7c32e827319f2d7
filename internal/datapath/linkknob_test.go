package datapath

import (
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// A link knob is read, set and restored through netlink like a file knob, in the knob's
// namespace; a value that is not a size changes nothing; a missing device counts as gone.
func TestLinkKnobRoundTrip(t *testing.T) {
	ns := "prg-knobtest"
	testutil.TempNetns(t, ns)
	ks := []Knob{{Netns: ns, Path: LinkKnobPath("lo", "gro_ipv4_max_size"), New: "185000"}}
	if err := readKnobs(ks); err != nil {
		t.Fatal(err)
	}
	old := ks[0].Old
	if old == "" || old == "185000" {
		t.Fatalf("old value %q", old)
	}
	if errs := writeKnobs(ks, false); len(errs) > 0 {
		t.Fatal(errs)
	}
	if v := CurrentValue(ks[0]); v != "185000" {
		t.Fatalf("after set: %q", v)
	}
	if d := DriftedKnobs(&State{Knobs: ks}); len(d) != 0 {
		t.Errorf("drifted right after set: %+v", d)
	}
	bad := ks[0]
	bad.New = "lots"
	if errs := writeKnobs([]Knob{bad}, false); len(errs) != 1 || !strings.Contains(errs[0].Error(), "not a size") {
		t.Errorf("bad value: %v", errs)
	}
	if errs := writeKnobs(ks, true); len(errs) > 0 {
		t.Fatal(errs)
	}
	if v := CurrentValue(ks[0]); v != old {
		t.Fatalf("after restore: %q, want %q", v, old)
	}
	gone := Knob{Netns: ns, Path: LinkKnobPath("prg-nodev", "gso_max_size"), Old: "65536"}
	if !deviceGone(gone) {
		t.Error("a missing device is not gone")
	}
	if errs := writeKnobs([]Knob{gone}, true); len(errs) != 0 {
		t.Errorf("restoring a gone device's knob: %v", errs)
	}
}
