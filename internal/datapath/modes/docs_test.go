package modes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// TestDocsOptionTables: each mode's page in docs/modes carries the option table generated from
// the mode's declaration (between <!-- options:MODE --> markers), so the docs cannot drift from
// the code. PEREGRINE_UPDATE_DOCS=1 rewrites the tables.
func TestDocsOptionTables(t *testing.T) {
	for _, name := range datapath.ModeNames() {
		path := filepath.Join("..", "..", "..", "docs", "modes", name+".md")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("mode %s has no page: %v", name, err)
			continue
		}
		s, err := datapath.Schema(name)
		if err != nil {
			t.Fatal(err)
		}
		begin, end := "<!-- options:"+name+" -->\n", "<!-- /options:"+name+" -->"
		text := string(b)
		i, j := strings.Index(text, begin), strings.Index(text, end)
		if i < 0 || j < i {
			t.Errorf("%s: no %q ... %q block", path, strings.TrimSpace(begin), end)
			continue
		}
		want := s.Markdown()
		if got := text[i+len(begin) : j]; got != want {
			if os.Getenv("PEREGRINE_UPDATE_DOCS") == "1" {
				text = text[:i+len(begin)] + want + text[j:]
				if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Errorf("%s: the option table differs from mode %s's declaration; run PEREGRINE_UPDATE_DOCS=1 go test ./internal/datapath/modes -run DocsOptionTables\ngot:\n%s\nwant:\n%s", path, name, got, want)
		}
	}
}
