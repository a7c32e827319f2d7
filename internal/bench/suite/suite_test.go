package suite

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/bench"
	"github.com/peregrine-net/peregrine/internal/lab"
)

func TestStudyCoversChapterTwo(t *testing.T) {
	var sizes, flows []int
	for _, s := range Study(false) {
		if err := s.Validate(); err != nil {
			t.Fatalf("study scenario %s: %v", s.Name, err)
		}
		if s.Name != "tcp" {
			continue
		}
		if len(s.Flows) == 1 {
			sizes = append(sizes, s.Sizes...)
		} else {
			flows = append(flows, s.Flows...)
		}
	}
	for _, want := range []int{16, 64, 256, 1024, 4096, 16384, 65536} {
		if !slices.Contains(sizes, want) {
			t.Errorf("full study lacks TCP message size %d (has %v)", want, sizes)
		}
	}
	for _, want := range []int{1, 2, 4, 8, 16, 40, 80} {
		if !slices.Contains(flows, want) {
			t.Errorf("full study lacks TCP flow count %d (has %v)", want, flows)
		}
	}
	steps := suites["study"].steps(false)
	if len(steps) != len(Study(false)) {
		t.Fatalf("study suite has %d steps, Study %d", len(steps), len(Study(false)))
	}
	for _, st := range steps {
		cfgs, err := bench.ParseConfigs(strings.Join(st.Configs, ","))
		if err != nil {
			t.Fatalf("step %q: %v", st.Title, err)
		}
		var styles []string
		for _, c := range cfgs {
			styles = append(styles, c.Style)
		}
		if want := []string{lab.StyleNative, lab.StyleLinux, lab.StyleDocker, lab.StyleFlannel}; !slices.Equal(styles, want) {
			t.Fatalf("step %q compares %v, want %v (native first)", st.Title, styles, want)
		}
	}
	if !strings.Contains(Help(), "Linux overlay") {
		t.Errorf("suite help should name the Linux overlay: %s", Help())
	}
}

func TestQuickStudyFitsFiveMinutes(t *testing.T) {
	var total time.Duration
	for _, s := range Study(true) {
		total += s.EstimatedDuration(len(studyConfigs))
	}
	if total > 4*time.Minute {
		t.Fatalf("quick study estimated at %s: too long for the 5-minute promise", total)
	}
}

func TestSuitesParseAndQuickFalconIsShort(t *testing.T) {
	for _, name := range Names() {
		for _, quick := range []bool{true, false} {
			for _, st := range suites[name].steps(quick) {
				s := st.Scenario
				if err := s.Validate(); err != nil {
					t.Errorf("suite %s step %q: %v", name, st.Title, err)
				}
				cs, err := bench.ParseConfigs(strings.Join(st.Configs, ","))
				if err != nil {
					t.Errorf("suite %s step %q: %v", name, st.Title, err)
				}
				// The many-flows step scores the fast path against itself (100 000 flows vs 1).
				if len(cs) > 0 && cs[0].Name() != "native" && st.Title != fpTitleFlows && name != "fastpath-k8s" {
					t.Errorf("suite %s step %q: the baseline (first config) should be native, is %s", name, st.Title, cs[0].Name())
				}
			}
		}
	}
	if d := Duration("falcon", true); d > 8*time.Minute {
		t.Errorf("quick falcon suite estimated at %s", d)
	}
	t.Logf("quick falcon suite: about %s; full: %s", Duration("falcon", true), Duration("falcon", false))
}
