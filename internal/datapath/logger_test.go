package datapath

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// Printf and Print (the agents' one-line messages) become one Info record each whose message is
// the formatted line, with the logger's attributes; the zero Logger and NewLogger(nil) write to
// slog's default, DiscardLogger nowhere.
func TestLoggerPrintfIsOneSlogRecord(t *testing.T) {
	var b bytes.Buffer
	lg := NewLogger(slog.New(slog.NewTextHandler(&b, nil)).With("mode", "m", "target", "h1"))
	lg.Printf("endpoints: %d live, %s", 3, "ok")
	lg.Print("stopping")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 records, got %q", b.String())
	}
	for i, want := range []string{`msg="endpoints: 3 live, ok"`, `msg=stopping`} {
		for _, w := range []string{"level=INFO", want, "mode=m", "target=h1"} {
			if !strings.Contains(lines[i], w) {
				t.Errorf("record %d %q lacks %q", i, lines[i], w)
			}
		}
	}

	var def bytes.Buffer
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, nil)))
	Logger{}.Printf("zero %d", 1)
	NewLogger(nil).Print("nil")
	DiscardLogger().Printf("dropped")
	if s := def.String(); !strings.Contains(s, `msg="zero 1"`) || !strings.Contains(s, "msg=nil") || strings.Contains(s, "dropped") {
		t.Fatalf("default logger got %q", s)
	}
}
