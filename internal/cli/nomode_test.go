package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/bench"
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// TestNoModeNamedOutsideItsPackage: the CLI, the report and the metrics name no mode (issue 31):
// no string literal is a mode's name or a list of them (a flag default, a comparison, a command
// name), and none imports a mode's package. A mode's own commands come from its package
// (datapath.Commander); mode names as data live with the bench. Prose that mentions a mode as an
// example (help text) is not a name the code acts on and is allowed.
func TestNoModeNamedOutsideItsPackage(t *testing.T) {
	names := map[string]bool{bench.ModeVanilla: true}
	pkgs := map[string]string{}
	for _, m := range datapath.Modes() {
		names[m.Name()] = true
		pkgs[reflect.TypeOf(m).PkgPath()] = m.Name()
	}
	if len(pkgs) < 5 {
		t.Fatalf("only %d mode packages registered: the test would prove nothing", len(pkgs))
	}
	found := 0
	for _, dir := range []string{".", "../report", "../metrics"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			found++
			fset := token.NewFileSet()
			af, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, im := range af.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				if m, ok := pkgs[p]; ok {
					t.Errorf("%s imports mode %s's package %s: declare what it needs in the mode (datapath.Commander) or take it from the registry", fset.Position(im.Pos()), m, path.Base(p))
				}
			}
			ast.Inspect(af, func(n ast.Node) bool {
				if _, ok := n.(*ast.ImportSpec); ok {
					return false
				}
				bl, ok := n.(*ast.BasicLit)
				if !ok || bl.Kind != token.STRING {
					return true
				}
				v, err := strconv.Unquote(bl.Value)
				if err != nil || !namesModes(v, names) {
					return true
				}
				t.Errorf("%s: string literal %q names a mode: the mode's package (or the bench's data) should", fset.Position(bl.Pos()), v)
				return true
			})
		}
	}
	if found < 10 {
		t.Fatalf("read only %d files: the test would prove nothing", found)
	}
}

// namesModes tells whether v is a mode name or a list of them (split on , + and spaces), the
// mode "nothing attached" (vanilla) alone not counting.
func namesModes(v string, names map[string]bool) bool {
	words := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == '+' || r == ' ' })
	if len(words) == 0 {
		return false
	}
	real := false
	for _, w := range words {
		if !names[w] {
			return false
		}
		if w != bench.ModeVanilla {
			real = true
		}
	}
	return real
}

// namesModes itself must catch what it is for, or the test above proves nothing.
func TestNamesModes(t *testing.T) {
	names := map[string]bool{"vanilla": true, "rps": true, "prism": true}
	for v, want := range map[string]bool{
		"prism": true, "vanilla,rps": true, "rps+prism": true, "vanilla": false,
		"attach prism": false, "": false, "rpsx": false, "prism rules": false,
	} {
		if got := namesModes(v, names); got != want {
			t.Errorf("namesModes(%q) = %v, want %v", v, got, want)
		}
	}
}
