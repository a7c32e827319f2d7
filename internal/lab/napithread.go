package lab

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// napiThreadMu serializes SetNAPIThread: the new kernel threads are told apart from those of
// other devices by appearing during the call.
var napiThreadMu sync.Mutex

// SetNAPIThread switches dev's NAPI (in namespace ns) to threaded mode and pins its kernel
// threads ("napi/<dev>-<id>") to cpus, so the device's receive poll and GRO run there, as a NIC's
// interrupt affinity would place them. The threads go with the device (lab down).
func SetNAPIThread(ns, dev string, cpus []int) error {
	napiThreadMu.Lock()
	defer napiThreadMu.Unlock()
	prefix := "napi/" + dev + "-"
	before := kthreads(prefix)
	err := netnsutil.WithSysfs(ns, func() error {
		p := "/sys/class/net/" + dev + "/threaded"
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("%s: write %s: %w (the device needs NAPI: GRO on)", ns, p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		var fresh []int
		for pid := range kthreads(prefix) {
			if !before[pid] {
				fresh = append(fresh, pid)
			}
		}
		if len(fresh) > 0 {
			for _, pid := range fresh {
				if err := unix.SchedSetaffinity(pid, &set); err != nil {
					return fmt.Errorf("%s/%s: pin NAPI thread %d to CPUs %v: %w", ns, dev, pid, cpus, err)
				}
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s/%s: threaded NAPI on, but no %s* kernel thread appeared", ns, dev, prefix)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kthreads are the PIDs of the kernel threads whose name starts with prefix.
func kthreads(prefix string) map[int]bool {
	out := map[int]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), prefix) {
			out[pid] = true
		}
	}
	return out
}
