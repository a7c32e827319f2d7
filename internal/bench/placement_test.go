package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/results"
)

// noPlacer is a registered mode that declares no placement class.
type noPlacer struct{}

const noPlacerName = "prg-test-noplacer"

func (noPlacer) Name() string            { return noPlacerName }
func (noPlacer) Summary() string         { return "test mode without a placement class" }
func (noPlacer) Options() *option.Schema { return nil }
func (noPlacer) Knobs(*datapath.Topology, datapath.Options) ([]datapath.Knob, error) {
	return nil, nil
}
func (noPlacer) Load(context.Context, *datapath.Topology, datapath.Options, *datapath.State) error {
	return nil
}
func (noPlacer) Unload(context.Context, *datapath.State) error { return nil }

func init() { datapath.Register(noPlacer{}) }

// Every config the suites and the CLI can name gets the class its modes declare, the stack the
// most spread of them; a mode without a class is recorded as unknown, with a note.
func TestPlacementRecorded(t *testing.T) {
	for cfg, want := range map[string]results.Placement{
		"native": results.PlacementOneCore, "docker": results.PlacementOneCore,
		"docker/rps": results.PlacementSecondCore, "docker/falcon": results.PlacementStagePerCore,
		"docker/mflow@split_at=device": results.PlacementSplitAfterNIC, "docker/falcon/prism": results.PlacementStagePerCore,
		"flannel/fastpath/prism": results.PlacementOneCore, "docker/" + noPlacerName: results.PlacementUnknown,
	} {
		c, err := ParseConfig(cfg)
		if err != nil {
			t.Fatalf("%s: %v", cfg, err)
		}
		var stack []string
		for _, m := range c.Stack {
			stack = append(stack, m.Mode)
		}
		got, note := placementOf(c.Name(), stack)
		if got != want {
			t.Errorf("%s: placement %s, want %s", cfg, got, want)
		}
		if (want == results.PlacementUnknown) != strings.Contains(note, "declares no CPU placement class") {
			t.Errorf("%s: note %q", cfg, note)
		}
	}
	// Every registered mode of this build declares one (the test mode aside).
	for _, name := range datapath.ModeNames() {
		if _, undeclared := datapath.PlacementOf(name); name != noPlacerName && len(undeclared) > 0 {
			t.Errorf("mode %s declares no placement class", name)
		}
	}
}

// An older file gets its classes from this build's modes, with a note; a recorded class and
// given namespaces are left as they are.
func TestFillPlacements(t *testing.T) {
	run := &results.Run{ID: "old", Configs: []results.Config{
		{Name: "native", Style: "native", Mode: ModeVanilla},
		{Name: "docker/falcon/prism", Style: "docker", Mode: "falcon+prism"},
		{Name: "given:a->b", Style: StyleGiven, Mode: "as found"},
		{Name: "docker/gone", Style: "docker", Mode: "gone"},
		{Name: "docker/rps", Style: "docker", Mode: "rps", Placement: results.PlacementOneCore},
	}}
	notes := FillPlacements(run)
	want := []results.Placement{results.PlacementOneCore, results.PlacementStagePerCore, results.PlacementUnknown,
		results.PlacementUnknown, results.PlacementOneCore}
	for i, c := range run.Configs {
		if c.Placement != want[i] {
			t.Errorf("%s: %s, want %s", c.Name, c.Placement, want[i])
		}
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "docker/falcon/prism stage-per-core") || strings.Contains(notes[0], "docker/rps") {
		t.Errorf("notes %q", notes)
	}
	if notes := FillPlacements(run); len(notes) != 0 {
		t.Errorf("a second fill found something to fill: %q", notes)
	}
}

// `bench compare --modes native,vanilla,fastpath` measures native once, as the baseline.
func TestModeConfigsNativeOnce(t *testing.T) {
	cs, err := ModeConfigs("flannel", []string{"native", "vanilla", "fastpath"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name())
	}
	if len(cs) != 3 || names[0] != "native" || names[1] != "flannel/vanilla" || names[2] != "flannel/fastpath" {
		t.Errorf("configs %v", names)
	}
}
