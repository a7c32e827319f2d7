package netnsutil_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// Open tells a missing namespace from a path that is no network namespace, with typed errors.
func TestOpenTypedErrors(t *testing.T) {
	if _, err := netnsutil.Open("/nonexistent/prg-nons"); !errors.Is(err, netnsutil.ErrNotExist) {
		t.Errorf("missing path: %v, want netnsutil.ErrNotExist", err)
	}
	stale := filepath.Join(t.TempDir(), "prg-stale") // what a deleted namespace's name leaves
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := netnsutil.Open(stale); !errors.Is(err, netnsutil.ErrNotNetNS) || errors.Is(err, netnsutil.ErrNotExist) {
		t.Errorf("plain file: %v, want netnsutil.ErrNotNetNS", err)
	}
	if _, err := netnsutil.Open("/proc/self/ns/mnt"); !errors.Is(err, netnsutil.ErrNotNetNS) {
		t.Errorf("a mount namespace: %v, want netnsutil.ErrNotNetNS", err)
	}
	ns, err := netnsutil.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("own network namespace: %v", err)
	}
	if ns.Fd() < 0 || ns.Path() != "/proc/self/ns/net" {
		t.Errorf("handle: fd %d path %s", ns.Fd(), ns.Path())
	}
	if err := ns.Close(); err != nil {
		t.Error(err)
	}
	self, _ := netnsutil.Open("")
	ran := false
	if err := self.Do(func() error { ran = true; return nil }); err != nil || !ran || self.Fd() != -1 {
		t.Errorf(`netnsutil.Open("") runs fn where we are: ran %v err %v fd %d`, ran, err, self.Fd())
	}
}

// One handle, entered many times, always lands in the same namespace, also after its name is
// gone (the handle holds it); the threads come back home (see the test above for the by-name
// wrappers).
func TestHandleEnteredManyTimes(t *testing.T) {
	const name = "prg-tnshandle"
	testutil.TempNetns(t, name)
	want, err := netnsutil.Inode(netnsutil.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netnsutil.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	inside := func() uint64 {
		var ino uint64
		if err := ns.Do(func() error {
			var err error
			ino, err = netnsutil.Inode("/proc/thread-self/ns/net")
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
	if err := netnsutil.Delete(name); err != nil {
		t.Fatal(err)
	}
	if got := inside(); got != want {
		t.Fatalf("after the name was deleted: namespace %d, want %d (the handle holds it)", got, want)
	}
	if _, err := netnsutil.Open(name); !errors.Is(err, netnsutil.ErrNotExist) {
		t.Fatalf("opening the deleted name: %v, want netnsutil.ErrNotExist", err)
	}
}
