package netnsutil_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
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
		n, err1 := netnsutil.Inode(fmt.Sprintf("/proc/self/task/%s/ns/net", task.Name()))
		m, err2 := netnsutil.Inode(fmt.Sprintf("/proc/self/task/%s/ns/mnt", task.Name()))
		if err1 == nil && err2 == nil {
			out[task.Name()] = [2]uint64{n, m}
		}
	}
	return out
}

// Regression: WithSysfs used to leave its thread in the target namespace (and a private mount
// namespace); when Go ran it on the main thread, the whole process then looked as if it lived
// in the lab namespace (/proc/self/ns/net), which confused device resolution and cleanup.
func TestWithSysfsAndDoLeaveNoThreadBehind(t *testing.T) {
	const ns = "prg-tnsutil"
	testutil.TempNetns(t, ns)
	rootNet, _ := netnsutil.Inode("/proc/self/ns/net")
	rootMnt, _ := netnsutil.Inode("/proc/self/ns/mnt")
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := netnsutil.ReadFileIn(ns, "/sys/class/net/lo/mtu")
			if err != nil || strings.TrimSpace(v) != "65536" {
				t.Errorf("read lo mtu in %s: %q %v", ns, v, err)
			}
			_ = netnsutil.Do(ns, func() error { return nil })
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
	if ino, _ := netnsutil.Inode(fmt.Sprintf("/proc/%d/ns/net", os.Getpid())); ino != rootNet {
		t.Errorf("main thread is in namespace %d, want %d", ino, rootNet)
	}
}

// Regression: Path("") was /proc/self/ns/net, the namespace of the process's main thread. Go
// runs any goroutine on the main thread, Do's included, so while one was inside a pod's
// namespace there, every stat of the "own" namespace (record keys, link pin names, endpoint
// domains) named the pod's: the k8s node agent's Repair then found its NIC link pin "missing"
// and failed to attach it again (tcx: file exists). Path("") must name the namespace of the
// calling thread, which for every goroutine outside Do is the process's own.
func TestOwnNamespaceWhileDoRuns(t *testing.T) {
	const ns = "prg-tnsown"
	testutil.TempNetns(t, ns)
	own, err := netnsutil.Inode(fmt.Sprintf("/proc/self/task/%d/ns/net", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = netnsutil.Do(ns, func() error { time.Sleep(200 * time.Microsecond); return nil })
			}
		}()
	}
	wrong := 0
	for i := 0; i < 20000; i++ {
		if ino, err := netnsutil.Inode(netnsutil.Path("")); err != nil || ino != own {
			wrong++
		}
	}
	close(stop)
	wg.Wait()
	if wrong > 0 {
		t.Errorf("Path(\"\") named another namespace than the caller's %d times in 20000 while Do ran", wrong)
	}
}
