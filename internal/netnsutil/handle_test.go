package netnsutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Open tells a missing namespace from a path that is no network namespace, with typed errors.
func TestOpenTypedErrors(t *testing.T) {
	if _, err := Open("/nonexistent/prg-nons"); !errors.Is(err, ErrNotExist) {
		t.Errorf("missing path: %v, want ErrNotExist", err)
	}
	stale := filepath.Join(t.TempDir(), "prg-stale") // what a deleted namespace's name leaves
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(stale); !errors.Is(err, ErrNotNetNS) || errors.Is(err, ErrNotExist) {
		t.Errorf("plain file: %v, want ErrNotNetNS", err)
	}
	if _, err := Open("/proc/self/ns/mnt"); !errors.Is(err, ErrNotNetNS) {
		t.Errorf("a mount namespace: %v, want ErrNotNetNS", err)
	}
	ns, err := Open("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("own network namespace: %v", err)
	}
	if ns.Fd() < 0 || ns.Path() != "/proc/self/ns/net" {
		t.Errorf("handle: fd %d path %s", ns.Fd(), ns.Path())
	}
	if err := ns.Close(); err != nil {
		t.Error(err)
	}
	self, _ := Open("")
	ran := false
	if err := self.Do(func() error { ran = true; return nil }); err != nil || !ran || self.Fd() != -1 {
		t.Errorf(`Open("") runs fn where we are: ran %v err %v fd %d`, ran, err, self.Fd())
	}
}

// One handle, entered many times, always lands in the same namespace, also after its name is
// gone (the handle holds it); the threads come back home (see the test above for the by-name
// wrappers).
func TestHandleEnteredManyTimes(t *testing.T) {
	requireRoot(t)
	const name = "prg-tnshandle"
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(name) })
	want, err := Inode(Path(name))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	inside := func() uint64 {
		var ino uint64
		if err := ns.Do(func() error {
			var err error
			ino, err = Inode("/proc/thread-self/ns/net")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ino
	}
	for i := 0; i < 8; i++ {
		if got := inside(); got != want {
			t.Fatalf("entry %d: namespace %d, want %d", i, got, want)
		}
	}
	var mtu string
	if err := ns.WithSysfs(func() error {
		b, err := os.ReadFile("/sys/class/net/lo/mtu")
		mtu = strings.TrimSpace(string(b))
		return err
	}); err != nil || mtu != "65536" {
		t.Fatalf("WithSysfs on the handle: lo mtu %q, %v", mtu, err)
	}
	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if got := inside(); got != want {
		t.Fatalf("after the name was deleted: namespace %d, want %d (the handle holds it)", got, want)
	}
	if _, err := Open(name); !errors.Is(err, ErrNotExist) {
		t.Fatalf("opening the deleted name: %v, want ErrNotExist", err)
	}
}
