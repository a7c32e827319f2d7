package testutil

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// HostileFiles makes, in a directory of the test's own, two files a reader of user-named files
// must refuse at once rather than read: a FIFO with no writer (a read blocks forever) and a
// sparse 1 TiB file (takes no disk; a read never ends). It returns their directory too.
func HostileFiles(t testing.TB) (dir, fifo, huge string) {
	t.Helper()
	dir = t.TempDir()
	fifo = filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge = filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 1<<40); err != nil {
		t.Fatal(err)
	}
	return dir, fifo, huge
}
