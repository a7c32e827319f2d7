package modes

import (
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// capabilities is every interface of the mode contract (internal/datapath/contract.go).
var capabilities = []reflect.Type{
	reflect.TypeFor[datapath.Mode](),
	reflect.TypeFor[datapath.Reporter](),
	reflect.TypeFor[datapath.AgentRunner](),
	reflect.TypeFor[datapath.Exampler](),
	reflect.TypeFor[datapath.BenchDefaulter](),
	reflect.TypeFor[datapath.Placer](),
	reflect.TypeFor[datapath.StageSteerer](),
	reflect.TypeFor[datapath.Repairer](),
	reflect.TypeFor[datapath.LiveConfigurer](),
	reflect.TypeFor[datapath.Upgrader](),
	reflect.TypeFor[datapath.ModeCounters](),
	reflect.TypeFor[datapath.Commander](),
}

// Every capability a registered mode implements is asserted in its package's contract.go (so the
// compiler keeps it), and no mode has a method named like a capability's with another signature
// (which would silently leave the capability out).
func TestModesAssertTheirCapabilities(t *testing.T) {
	if got := declaredCapabilities(t); len(got) != len(capabilities)+1 { // + Completer, the config's
		t.Errorf("contract.go declares %d interfaces, this test knows %d (+ Completer): add the new one to capabilities", len(got), len(capabilities))
	}
	asserted := 0
	for _, m := range datapath.Modes() {
		mt := reflect.TypeOf(m)
		src, err := os.ReadFile(filepath.Join("..", path.Base(mt.PkgPath()), "contract.go"))
		if err != nil {
			t.Errorf("mode %s: %v (each mode asserts its capabilities there)", m.Name(), err)
			continue
		}
		for _, c := range capabilities {
			if mt.Implements(c) {
				if !regexp.MustCompile(`_ datapath\.` + c.Name() + `\s+= mode\{\}`).Match(src) {
					t.Errorf("mode %s implements datapath.%s but its contract.go does not assert it", m.Name(), c.Name())
				}
				asserted++
				continue
			}
			for i := 0; i < c.NumMethod(); i++ {
				if mm, ok := mt.MethodByName(c.Method(i).Name); ok {
					t.Errorf("mode %s has %s with type %v, not datapath.%s's %s %v: the capability is silently missing",
						m.Name(), mm.Name, mm.Type, c.Name(), c.Method(i).Name, c.Method(i).Type)
				}
			}
		}
	}
	t.Logf("%d modes, %d capabilities asserted", len(datapath.Modes()), asserted)
}

// declaredCapabilities lists the interfaces contract.go declares.
func declaredCapabilities(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join("..", "contract.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^type (\w+) interface`).FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	return out
}
