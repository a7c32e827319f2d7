package netnsutil

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Errors Open gives (wrapped, with the namespace's name): test them with errors.Is.
var (
	// ErrNotExist: nothing at the namespace's path (it was never made, or was deleted).
	ErrNotExist = errors.New("network namespace does not exist")
	// ErrNotNetNS: the path is there but is no network namespace (a stale file under
	// /var/run/netns whose bind mount is gone, or another kind of namespace).
	ErrNotNetNS = errors.New("not a network namespace")
)

// NS is an open network namespace: opened once, entered as often as needed with Do, closed at
// the end. Holding it keeps the namespace alive even if its name is deleted, so hold it only
// for one operation.
type NS struct {
	name string
	f    *os.File // nil for the namespace peregrine runs in (name "")
}

// Open opens a namespace by name (under /var/run/netns) or path. "" is the namespace the
// process runs in: Do on it runs fn where it is.
func Open(name string) (*NS, error) {
	if name == "" {
		return &NS{}, nil
	}
	p := Path(name)
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("network namespace %q (%s): %w (see `ip netns list`)", name, p, ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("open network namespace %q: %w", name, err)
	}
	// NS_GET_NSTYPE answers only on an nsfs file, with the kind of namespace it is.
	kind, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil || kind != unix.CLONE_NEWNET {
		f.Close()
		return nil, fmt.Errorf("network namespace %q (%s): %w", name, p, ErrNotNetNS)
	}
	return &NS{name: name, f: f}, nil
}

// Path is where the namespace was opened from ("/proc/thread-self/ns/net" for the process's own).
func (ns *NS) Path() string { return Path(ns.name) }

// Name is the name (or path) it was opened by.
func (ns *NS) Name() string { return ns.name }

// Fd is the open namespace's descriptor (for setns, netlink handles); -1 for the process's own.
func (ns *NS) Fd() int {
	if ns.f == nil {
		return -1
	}
	return int(ns.f.Fd())
}

// Close releases the namespace.
func (ns *NS) Close() error {
	if ns == nil || ns.f == nil {
		return nil
	}
	return ns.f.Close()
}

// threadTainted wraps an error after which the thread's namespaces are unknown: Do then keeps
// the thread locked, so that it dies with its goroutine instead of serving other goroutines.
type threadTainted struct{ error }

func (e threadTainted) Unwrap() error { return e.error }

// Do runs fn with the calling goroutine's thread inside the namespace (on a fresh goroutine,
// locked to its thread). Sockets fn opens stay in that namespace after Do returns; goroutines
// started by fn do NOT inherit it.
func (ns *NS) Do(fn func() error) error {
	if ns.f == nil {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(ns.Fd(), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %q: %w", ns.name, err)
			return
		}
		ferr := fn()
		var tainted threadTainted
		if errors.As(ferr, &tainted) {
			errc <- tainted.error // the thread stays locked and is discarded
			return
		}
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it dies with this goroutine instead of leaking the namespace.
			errc <- errors.Join(ferr, fmt.Errorf("leave network namespace %q: %w", ns.name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// WithSysfs is Do with a private mount of sysfs on /sys, so that /sys/class/net shows the
// namespace's devices (what `ip netns exec` does). Afterwards the thread returns to its mount
// namespace and working directory as well; if that fails it is discarded (see Do). (Go cannot
// kill the main thread: it would stay wedged there, which is why restoring matters and a leaked
// lock is only the last resort.)
func (ns *NS) WithSysfs(fn func() error) error {
	if ns.f == nil {
		return fn()
	}
	return ns.Do(func() error {
		origMnt, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			return err
		}
		defer origMnt.Close()
		// Unsharing the mount namespace gives this thread its own cwd, and setns back into the
		// original one resets that cwd to "/": remember it, or the thread would later serve other
		// goroutines with relative paths resolved from the root.
		origCwd, err := os.Open(".")
		if err != nil {
			return err
		}
		defer origCwd.Close()
		ferr := func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("make mounts private: %w", err)
			}
			// sysfs shows the network namespace of whoever mounts it: this thread's, now.
			if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
				return fmt.Errorf("mount sysfs for namespace %q: %w", ns.name, err)
			}
			return fn()
		}()
		// The private mount namespace dies with its last user once we leave it.
		if err := unix.Setns(int(origMnt.Fd()), unix.CLONE_NEWNS); err != nil {
			return threadTainted{errors.Join(ferr, fmt.Errorf("return to original mount namespace: %w", err))}
		}
		if err := unix.Fchdir(int(origCwd.Fd())); err != nil {
			return threadTainted{errors.Join(ferr, fmt.Errorf("return to original working directory: %w", err))}
		}
		return ferr
	})
}

// Set holds the namespaces one operation enters, each opened once (the zero Set is empty).
type Set struct{ open map[string]*NS }

// Open returns the set's handle of a namespace, opening it the first time.
func (s *Set) Open(name string) (*NS, error) {
	if ns, ok := s.open[name]; ok {
		return ns, nil
	}
	ns, err := Open(name)
	if err != nil {
		return nil, err
	}
	if s.open == nil {
		s.open = map[string]*NS{}
	}
	s.open[name] = ns
	return ns, nil
}

// Close closes every handle of the set.
func (s *Set) Close() error {
	var errs []error
	for name, ns := range s.open {
		errs = append(errs, ns.Close())
		delete(s.open, name)
	}
	return errors.Join(errs...)
}
