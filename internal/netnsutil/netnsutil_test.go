package netnsutil

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// threadNamespaces returns, for every thread of this process, its net and mnt namespace inodes.
func threadNamespaces(t *testing.T) map[string][2]uint64 {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]uint64{}
	for _, task := range tasks {
		n, err1 := Inode(fmt.Sprintf("/proc/self/task/%s/ns/net", task.Name()))
		m, err2 := Inode(fmt.Sprintf("/proc/self/task/%s/ns/mnt", task.Name()))
		if err1 == nil && err2 == nil {
			out[task.Name()] = [2]uint64{n, m}
		}
	}
	return out
}

// requireRoot is testutil.RequireRoot's rule (testutil imports this package).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("PEREGRINE_ALLOW_NONROOT") == "1" {
			t.Skip("needs root")
		}
		t.Fatal("needs root (network namespaces); run with sudo, or set PEREGRINE_ALLOW_NONROOT=1 to skip")
	}
}

// Regression: WithSysfs used to leave its thread in the target namespace (and a private mount
// namespace); when Go ran it on the main thread, the whole process then looked as if it lived
// in the lab namespace (/proc/self/ns/net), which confused device resolution and cleanup.
func TestWithSysfsAndDoLeaveNoThreadBehind(t *testing.T) {
	requireRoot(t)
	const ns = "prg-tnsutil"
	if err := Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(ns) })
	rootNet, _ := Inode("/proc/self/ns/net")
	rootMnt, _ := Inode("/proc/self/ns/mnt")
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := ReadFileIn(ns, "/sys/class/net/lo/mtu")
			if err != nil || strings.TrimSpace(v) != "65536" {
				t.Errorf("read lo mtu in %s: %q %v", ns, v, err)
			}
			_ = Do(ns, func() error { return nil })
		}()
	}
	wg.Wait()
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for tid, ino := range threadNamespaces(t) {
		if ino[0] != rootNet || ino[1] != rootMnt {
			t.Errorf("thread %s left in net %d mnt %d (want %d, %d)", tid, ino[0], ino[1], rootNet, rootMnt)
		}
		// Leaving a mount namespace resets a thread's cwd to "/"; WithSysfs must restore it, or
		// relative paths (testdata/...) fail on whichever goroutine lands on that thread.
		if dir, err := os.Readlink("/proc/self/task/" + tid + "/cwd"); err == nil && dir != cwd {
			t.Errorf("thread %s left in directory %s (want %s)", tid, dir, cwd)
		}
	}
	if ino, _ := Inode(fmt.Sprintf("/proc/%d/ns/net", os.Getpid())); ino != rootNet {
		t.Errorf("main thread is in namespace %d, want %d", ino, rootNet)
	}
}
