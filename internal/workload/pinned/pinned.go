// Package pinned runs a piece of work on an OS thread of its own, optionally pinned to one CPU,
// as the packet injector's sender and the UDP sink's receiver need: sched_setaffinity acts on a
// thread, so pinning the goroutine's thread pins exactly that work and nothing else.
package pinned

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn on a new goroutine locked to its OS thread, pins that thread to *cpu first when cpu
// is not nil, and waits for fn's result. fn does not run when pinning fails; the error then says
// "pin <role> to CPU n". The goroutine returns without unlocking, so the runtime retires the
// thread and its affinity never leaks to other goroutines.
func Do(cpu *int, role string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if cpu != nil {
			var set unix.CPUSet
			set.Set(*cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				done <- fmt.Errorf("pin %s to CPU %d: %w", role, *cpu, err)
				return
			}
		}
		done <- fn()
	}()
	return <-done
}
