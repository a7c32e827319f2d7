package probe

import (
	"io"
	"strings"
	"testing"
)

// mustParse parses fixture text with one of the package's parsers and stops the test on error.
func mustParse[T any](t *testing.T, parse func(io.Reader) (T, error), text string) T {
	t.Helper()
	v, err := parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// assertParseFails checks that parse refuses every input of bad (case name -> text).
func assertParseFails[T any](t *testing.T, parse func(io.Reader) (T, error), bad map[string]string) {
	t.Helper()
	for name, in := range bad {
		if _, err := parse(strings.NewReader(in)); err == nil {
			t.Errorf("%s: input %q parsed without error", name, in)
		}
	}
}
