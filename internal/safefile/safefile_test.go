package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

func TestWriteReadReplace(t *testing.T) {
	d := filepath.Join(t.TempDir(), "run", "state")
	p := filepath.Join(d, "x.json")
	for _, v := range []string{"one", "two"} {
		if err := WriteFile(p, []byte(v)); err != nil {
			t.Fatal(err)
		}
		if b, err := ReadFile(p); err != nil || string(b) != v {
			t.Fatalf("read back %q, %v; want %q", b, err, v)
		}
	}
	st, _ := os.Stat(p)
	dst, _ := os.Stat(d)
	if st.Mode().Perm() != FileMode || dst.Mode().Perm() != DirMode {
		t.Fatalf("file %v, dir %v: want %o in %o", st.Mode(), dst.Mode(), FileMode, DirMode)
	}
	entries, _ := os.ReadDir(d)
	if len(entries) != 1 {
		t.Fatalf("a replacement left its temporary file: %v", entries)
	}
	if _, err := ReadFile(filepath.Join(d, "none.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v, want os.ErrNotExist", err)
	}
	if err := Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := Remove(p); err != nil {
		t.Fatalf("removing a missing file: %v", err)
	}
}

// A symlink planted at the file, or in place of the directory, is never followed: the target
// stays untouched and the error says why.
func TestPlantedSymlinksRefused(t *testing.T) {
	root := t.TempDir()
	victim := filepath.Join(root, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(root, "state")
	if err := MkdirPrivate(d); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(d, "x.log")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	for name, op := range map[string]func() error{
		"append": func() error { f, err := OpenAppend(link); closeIf(f); return err },
		"lock":   func() error { f, err := OpenLock(link); closeIf(f); return err },
		"read":   func() error { _, err := ReadFile(link); return err },
	} {
		if err := op(); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("%s through a planted link: %v, want a refusal naming the link", name, err)
		}
	}
	// The directory itself replaced by a link to another one.
	other := filepath.Join(root, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(root, "linked")
	if err := os.Symlink(other, linked); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(linked, "x.json"), []byte("{}")); err == nil {
		t.Error("wrote through a symlinked directory")
	}
	if entries, _ := os.ReadDir(other); len(entries) != 0 {
		t.Errorf("something was written through the link: %v", entries)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Errorf("the link's target changed: %q", b)
	}
	// A FIFO in place of a log would block a writer: refused as not a regular file.
	fifo := filepath.Join(d, "fifo.log")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenAppend(fifo); err == nil || !strings.Contains(err.Error(), "regular") {
		closeIf(f)
		t.Errorf("a FIFO as a log: %v", err)
	}
}

// An older peregrine made its directories 0755 and its lock 0644: both are tightened.
func TestLooseModesTightened(t *testing.T) {
	d := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(d, ".lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := OpenLock(lock)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(lock)
	dst, _ := os.Stat(d)
	if st.Mode().Perm() != FileMode || dst.Mode().Perm() != DirMode {
		t.Fatalf("lock %v in %v: want %o in %o", st.Mode(), dst.Mode(), FileMode, DirMode)
	}
}

// A directory someone else made (another user could have put anything in it) is refused.
func TestForeignDirectoryRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a directory that belongs to another user")
	}
	d := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(d, "x.json"), []byte("{}")); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("write into a directory of uid 65534: %v", err)
	}
}

func closeIf(f *os.File) {
	if f != nil {
		f.Close()
	}
}

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }

// ReadRegular is what reads a file a user points peregrine at (a config, prism's rules_file): a
// FIFO with no writer, /dev/zero and a huge file must each be refused at once, never read.
func TestReadRegularRefusesWhatCouldBlockOrNeverEnd(t *testing.T) {
	dir, fifo, huge := testutil.HostileFiles(t)
	ok := filepath.Join(dir, "ok")
	if err := os.WriteFile(ok, []byte("proto=udp dport=9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link") // a ConfigMap's file is a symlink: followed
	if err := os.Symlink("ok", link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{fifo, "a FIFO"}, {"/dev/zero", "a character device"}, {dir, "a directory"},
		{huge, "larger than"},
	} {
		done := make(chan error, 1)
		go func() { _, err := ReadRegular(c.path, 1<<20); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ReadRegular(%s) = %v, want an error saying %q", c.path, err, c.want)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("ReadRegular(%s) blocked", c.path)
		}
	}
	for _, p := range []string{ok, link} {
		b, err := ReadRegular(p, 1<<20)
		if err != nil || string(b) != "proto=udp dport=9\n" {
			t.Errorf("ReadRegular(%s) = %q, %v", p, b, err)
		}
	}
	if _, err := ReadRegular(ok, 4); err == nil {
		t.Error("a file over max was read")
	}
}
