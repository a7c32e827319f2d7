package lab

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// TestNAPIThreadPinned: with napi_thread, each host's underlay polls in threaded NAPI mode and
// its kernel threads may run on the rx CPUs only; lab down takes the threads with the devices.
func TestNAPIThreadPinned(t *testing.T) {
	before := kthreads("napi/eth0-")
	l := upForTest(t, Spec{Name: "napit", Style: StyleFlannel, RxCPUs: []int{0}, NAPIThread: true})
	for i := 1; i <= 2; i++ {
		v, err := netnsutil.ReadFileIn(l.Spec.ns(hostName(i)), "/sys/class/net/eth0/threaded")
		if err != nil || strings.TrimSpace(v) != "1" {
			t.Errorf("host %d: threaded = %q, %v; want 1", i, v, err)
		}
	}
	var fresh []int
	for pid := range kthreads("napi/eth0-") {
		if !before[pid] {
			fresh = append(fresh, pid)
		}
	}
	if len(fresh) < 2 {
		t.Fatalf("%d new NAPI threads, want one per host underlay at least", len(fresh))
	}
	for _, pid := range fresh {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &set); err != nil {
			t.Fatal(err)
		}
		if set.Count() != 1 || !set.IsSet(0) {
			t.Errorf("NAPI thread %d may run on %d CPUs, want CPU0 only", pid, set.Count())
		}
	}
	if err := Down(l.Spec.Name, nil, nil); err != nil {
		t.Fatal(err)
	}
	// Namespaces are torn down asynchronously (the kernel's cleanup_net): give it a moment.
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range fresh {
		for {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("NAPI thread %d outlived its lab", pid)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
