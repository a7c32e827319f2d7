// Package netnsutil runs code and commands inside named network namespaces.
//
// Named namespaces follow iproute2's convention (a bind mount under /var/run/netns),
// so everything peregrine creates is visible to `ip netns` and the other way round.
// Go schedules goroutines on arbitrary OS threads, so every namespace switch here
// locks its goroutine to a thread and either switches back or lets the thread die.
package netnsutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RunDir is where iproute2 keeps the bind mounts of named namespaces.
const RunDir = "/var/run/netns"

// Path returns the filesystem path of a namespace given by name or by path.
// An empty name means the namespace of the calling process: the calling thread's, which
// outside Do is the process's own. Not /proc/self/ns/net: that is the main thread's, and Go
// runs any goroutine there, Do's too, so while one is inside a pod's namespace it names the
// pod's (the node agent then took its own link pins for missing ones).
func Path(name string) string {
	switch {
	case name == "":
		return "/proc/thread-self/ns/net"
	case strings.Contains(name, "/"):
		return name
	default:
		return filepath.Join(RunDir, name)
	}
}

// Exists reports whether a named namespace exists.
func Exists(name string) bool {
	if name == "" {
		return true
	}
	var st unix.Statfs_t
	if err := unix.Statfs(Path(name), &st); err != nil {
		return false
	}
	// A bind-mounted namespace file lives on nsfs; a stale, unmounted file does not.
	return st.Type == unix.NSFS_MAGIC
}

// List returns the names of all named namespaces, optionally filtered by prefix.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Create makes a new named namespace. It fails if the name is taken.
func Create(name string) error {
	if _, err := os.Stat(Path(name)); err == nil {
		return fmt.Errorf("network namespace %q already exists", name)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name) // switches this thread into the new namespace
		if err != nil {
			errc <- fmt.Errorf("create network namespace %q: %w", name, err)
			// The thread may be in an unknown namespace: let it die with the goroutine.
			return
		}
		h.Close()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return to original namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}

// Delete removes a named namespace (unmount and remove its file). A missing one is not an error.
func Delete(name string) error {
	p := Path(name)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// Handle opens a namespace by name or path. The caller closes it.
func Handle(name string) (netns.NsHandle, error) {
	if name == "" {
		return netns.Get()
	}
	h, err := netns.GetFromPath(Path(name))
	if err != nil {
		return netns.None(), fmt.Errorf("open network namespace %q: %w (does it exist? see `ip netns list`)", name, err)
	}
	return h, nil
}

// Do runs fn inside the namespace given by name: Open, NS.Do, Close. An operation that enters
// a namespace several times opens it once and calls NS.Do instead.
func Do(name string, fn func() error) error {
	ns, err := Open(name)
	if err != nil {
		return err
	}
	defer ns.Close()
	return ns.Do(fn)
}

// WithSysfs runs fn inside the namespace given by name with its /sys (see NS.WithSysfs).
func WithSysfs(name string, fn func() error) error {
	ns, err := Open(name)
	if err != nil {
		return err
	}
	defer ns.Close()
	return ns.WithSysfs(fn)
}

// ReadFileIn reads a file (sysfs or procfs) as seen from inside the namespace.
func ReadFileIn(name, path string) (string, error) {
	var out []byte
	err := WithSysfs(name, func() error {
		b, err := os.ReadFile(path)
		out = b
		return err
	})
	return string(out), err
}

// WriteFileIn writes a file (sysfs or procfs) as seen from inside the namespace.
func WriteFileIn(name, path, value string) error {
	return WithSysfs(name, func() error {
		return os.WriteFile(path, []byte(value), 0o644)
	})
}

// Sysctl writes /proc/sys/<key with dots as slashes> inside the namespace and returns the old value.
func Sysctl(name, key, value string) (old string, err error) {
	p := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	err = Do(name, func() error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		old = strings.TrimSpace(string(b))
		return os.WriteFile(p, []byte(value), 0o644)
	})
	return old, err
}

// Command builds a command that runs inside the namespace (via `ip netns exec`, which also
// gives the command a /sys of that namespace). An empty name runs it where we are.
func Command(ctx context.Context, name string, argv ...string) *exec.Cmd {
	if name == "" {
		return exec.CommandContext(ctx, argv[0], argv[1:]...)
	}
	args := append([]string{"netns", "exec", name}, argv...)
	return exec.CommandContext(ctx, "ip", args...)
}

// Run runs a command inside the namespace and returns its combined output; the error names the command.
func Run(ctx context.Context, name string, argv ...string) (string, error) {
	out, err := Command(ctx, name, argv...).CombinedOutput()
	if err != nil {
		where := name
		if where == "" {
			where = "current namespace"
		}
		return string(out), fmt.Errorf("%s (in %s): %w: %s", strings.Join(argv, " "), where, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Inode returns the namespace inode number, which identifies a namespace across paths and pids.
func Inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// PIDsIn returns the processes that live in the given namespace (by inode): every thread of
// theirs is in it. A process with only some threads there (a Go program such as another
// peregrine visiting the namespace through Do) is a visitor, not a resident, and is left out.
func PIDsIn(ino uint64) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if i, err := Inode(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil || i != ino {
			continue
		}
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		resident := true
		for _, t := range tasks {
			if i, err := Inode(fmt.Sprintf("/proc/%d/task/%s/ns/net", pid, t.Name())); err == nil && i != ino {
				resident = false
				break
			}
		}
		if resident {
			pids = append(pids, pid)
		}
	}
	return pids
}
