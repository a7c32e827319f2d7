package labtest

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// MapsGone reports (as errors of the test) every map of ids that still exists 3 s after a
// detach: a map goes once the last reference to it does, which is a little after the unpin.
func MapsGone(t testing.TB, ids []ebpf.MapID) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for _, id := range ids {
		for {
			m, err := ebpf.NewMapFromID(id)
			if err != nil {
				break
			}
			m.Close()
			if time.Now().After(deadline) {
				t.Errorf("map %d still exists after detach", id)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
