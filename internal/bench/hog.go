package bench

import (
	"context"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// hog keeps the given CPUs busy with a spinning thread each, at normal priority: the induced
// hotspot of FALCON's static-vs-dynamic experiment (a CPU that a static hash keeps choosing
// although something else is running there).
type hog struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startHog(cpus []int) *hog {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hog{cancel: cancel}
	for _, c := range cpus {
		h.wg.Add(1)
		go func(cpu int) {
			defer h.wg.Done()
			runtime.LockOSThread()
			var orig unix.CPUSet
			if unix.SchedGetaffinity(0, &orig) != nil {
				runtime.UnlockOSThread()
				return
			}
			var set unix.CPUSet
			set.Set(cpu)
			if unix.SchedSetaffinity(0, &set) != nil {
				runtime.UnlockOSThread()
				return
			}
			// Give the thread its old affinity back before Go may reuse it.
			defer func() {
				if unix.SchedSetaffinity(0, &orig) == nil {
					runtime.UnlockOSThread()
				}
			}()
			x := 0
			for ctx.Err() == nil {
				for i := 0; i < 1<<16; i++ {
					x += i
				}
			}
			_ = x
		}(c)
	}
	return h
}

func (h *hog) stop() {
	if h == nil {
		return
	}
	h.cancel()
	h.wg.Wait()
}
