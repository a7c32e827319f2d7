package bench

import (
	"slices"
	"strings"
	"testing"

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
		cfgs, err := ParseConfigs(strings.Join(st.Configs, ","))
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
	if !strings.Contains(SuiteHelp(), "Linux overlay") {
		t.Errorf("suite help should name the Linux overlay: %s", SuiteHelp())
	}
}

func TestLinuxConfig(t *testing.T) {
	c, err := ParseConfig("linux")
	if err != nil || c.Style != lab.StyleLinux || c.Mode != ModeVanilla || len(c.Stack) != 0 {
		t.Fatalf("ParseConfig(linux) = %+v, %v", c, err)
	}
	// Modes need a container overlay: the config must say so before any lab is built.
	for _, s := range []string{"linux/falcon", "linux/fastpath", "native/rps"} {
		if _, err := ParseConfig(s); err == nil || !strings.Contains(err.Error(), "docker or flannel") {
			t.Errorf("ParseConfig(%s) = %v, want an error naming the styles modes run on", s, err)
		}
	}
}
