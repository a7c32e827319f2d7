package netnsutil

import "testing"

func TestLabel(t *testing.T) {
	for in, want := range map[string]string{
		"":                         "this node",
		"prg-a-h1":                 "prg-a-h1",
		RunDir + "/prg-a-h1":       "prg-a-h1",
		"/var/run/docker/netns/ab": "/var/run/docker/netns/ab",
	} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
}
