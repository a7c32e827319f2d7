package fastpath

import (
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
)

// u6Notes rewrites only the note about flannel-v6.1 itself, keeping its namespace label.
func TestU6Notes(t *testing.T) {
	ov := &overlay{VX: endpoints.VXLAN{Dev: datapath.Dev{Netns: "prg-x-h1", Name: "flannel.1"}}}
	notes := []string{
		"prg-x-h1/flannel-v6.1: only one routed VXLAN overlay per namespace gets the fast path (prg-x-h1/flannel.1 does); its traffic takes the normal path",
		"prg-x-h1/flannel-v6.10: only one routed VXLAN overlay per namespace gets the fast path (prg-x-h1/flannel.1 does); its traffic takes the normal path",
		"prg-x-h1/flannel.1 computes outer UDP checksums",
	}
	got := u6Notes(append([]string{}, notes...), "flannel-v6.1", ov)
	if !strings.HasPrefix(got[0], "prg-x-h1/flannel-v6.1: the IPv6 underlay beside ") || !strings.Contains(got[0], "both ways") {
		t.Fatalf("flannel-v6.1's note: %q", got[0])
	}
	if got[1] != notes[1] || got[2] != notes[2] {
		t.Fatalf("other notes changed: %q", got[1:])
	}
	if g := u6Notes(append([]string{}, notes...), "", ov); g[0] != notes[0] {
		t.Fatalf("no device, yet the note changed: %q", g[0])
	}
}
