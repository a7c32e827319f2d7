// Package safefile reads and writes root's runtime records (/run/peregrine) in directories a less
// trusted process may have had a hand in (the pd recipe used to mount /run/peregrine into
// containers). No symlink is followed in any component of a path (openat2 RESOLVE_NO_SYMLINKS),
// files are created 0600 in directories that are ours and 0700, and every operation on a file
// goes through a descriptor of its verified directory, so the directory cannot be swapped
// between the check and the write. A replacement is atomic: a fresh file (O_EXCL), then a rename.
package safefile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Modes of what this package creates: the records are root's alone. Parents it has to create
// on the way stay traversable (0755): /run/peregrine also holds the PipeDevice socket directory.
const (
	FileMode   = 0o600
	DirMode    = 0o700
	parentMode = 0o755
)

func openNoLinks(dirfd int, path string, flags uint64, mode uint64) (int, error) {
	if flags&unix.O_CREAT == 0 {
		mode = 0 // openat2 refuses a mode without O_CREAT
	}
	for {
		fd, err := unix.Openat2(dirfd, path, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Mode: mode, Resolve: unix.RESOLVE_NO_SYMLINKS})
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openDir opens a directory without following symlinks; with create, a missing one is made
// with perm, and missing parents 0755.
func openDir(path string, flags uint64, perm uint32, create bool) (int, error) {
	fd, err := openNoLinks(unix.AT_FDCWD, path, flags|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) && create && filepath.Dir(path) != path {
		pfd, perr := openDir(filepath.Dir(path), unix.O_PATH, parentMode, true)
		if perr != nil {
			return -1, perr
		}
		err = unix.Mkdirat(pfd, filepath.Base(path), perm)
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, &os.PathError{Op: "mkdir", Path: path, Err: err}
		}
		fd, err = openNoLinks(unix.AT_FDCWD, path, flags|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return -1, refused("open directory", path, err)
	}
	return fd, nil
}

// dir opens path as a directory of ours: no symlink on the way, owned by this user, not open to
// group or others (a looser one left by an older peregrine is tightened to 0700). With create, a
// missing directory is made (0700; missing parents 0755, whose owner is not checked: /run is
// root's, and every file operation goes through this directory's descriptor).
func dir(path string, create bool) (int, error) {
	fd, err := openDir(path, unix.O_RDONLY, DirMode, create)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return -1, fmt.Errorf("refusing directory %s: it belongs to uid %d, not to us (uid %d): someone else made it; remove it", path, st.Uid, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		if err := unix.Fchmod(fd, DirMode); err != nil {
			unix.Close(fd)
			return -1, &os.PathError{Op: "chmod", Path: path, Err: err}
		}
	}
	return fd, nil
}

// refused explains the errors a planted link gives (ELOOP from RESOLVE_NO_SYMLINKS or O_NOFOLLOW).
func refused(op, path string, err error) error {
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("refusing %s: a symbolic link is on its path (peregrine follows none in its state directories): %w", path, &os.PathError{Op: op, Path: path, Err: err})
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// MkdirPrivate makes path (and missing parents) a directory of ours, mode 0700.
func MkdirPrivate(path string) error {
	fd, err := dir(path, true)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// WriteFile replaces path with data atomically: a new 0600 file created with O_EXCL beside it,
// then renamed over it. The directory is made private first.
func WriteFile(path string, data []byte) error {
	dfd, err := dir(filepath.Dir(path), true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	base := filepath.Base(path)
	tmp := "." + base + "." + hex.EncodeToString(rnd[:]) + ".tmp"
	fd, err := openNoLinks(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, FileMode)
	if err != nil {
		return refused("create", filepath.Join(filepath.Dir(path), tmp), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(filepath.Dir(path), tmp))
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, base)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return &os.PathError{Op: "write", Path: path, Err: werr}
	}
	return nil
}

// ReadFile reads a file of a private directory; a symlink anywhere on the path, or a directory
// that is not ours, is refused. A missing file or directory gives an error that is os.ErrNotExist.
func ReadFile(path string) ([]byte, error) {
	f, err := open(path, unix.O_RDONLY, false)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// OpenAppend opens a log for appending, creating it (0600, in a private directory) if needed.
func OpenAppend(path string) (*os.File, error) {
	return open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT, true)
}

// OpenLock opens a lock file (read-write, created 0600 in a private directory; a looser one from
// an older peregrine is tightened, so other users cannot take the lock).
func OpenLock(path string) (*os.File, error) {
	f, err := open(path, unix.O_RDWR|unix.O_CREAT, true)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(FileMode); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// open opens a regular file of a private directory through the directory's descriptor.
func open(path string, flags uint64, create bool) (*os.File, error) {
	dfd, err := dir(filepath.Dir(path), create)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	fd, err := openNoLinks(dfd, filepath.Base(path), flags|unix.O_NONBLOCK, FileMode)
	if errors.Is(err, unix.ENXIO) { // a FIFO without a reader
		return nil, fmt.Errorf("refusing %s: not a regular file", path)
	}
	if err != nil {
		return nil, refused("open", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("refusing %s: not a regular file", path)
	}
	// O_NONBLOCK only guarded the open against a planted FIFO; regular files ignore it, but
	// clear it so the descriptor behaves as any other.
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Remove removes a file of a private directory (through its descriptor); a missing one is not
// an error.
func Remove(path string) error {
	dfd, err := dir(filepath.Dir(path), false)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, filepath.Base(path), 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: path, Err: err}
	}
	return nil
}

// ErrNotRegular refuses a FIFO, a device, a socket or a directory where a file of text was asked
// for: reading one could block forever (a FIFO with no writer) or never end (/dev/zero).
var ErrNotRegular = errors.New("not a regular file")

// ReadRegular reads a regular file of at most max bytes, following symlinks (a ConfigMap's file
// is one), for text a user points peregrine at (a config, a rules file). It cannot block: the
// open is O_NONBLOCK (a FIFO's open would otherwise wait for a writer) and the file's type is
// checked on the descriptor before any read; a file over max is refused before it is read. Its
// errors name the path and what is wrong, never the content.
func ReadRegular(path string, max int64) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s: %w (%s): give a file", path, ErrNotRegular, fileType(st.Mode))
	}
	if st.Size > max {
		return nil, fmt.Errorf("%s: %d bytes, larger than the %d allowed", path, st.Size, max)
	}
	// The size may grow between the fstat and the read (or lie: some pseudo-files say 0): the
	// read itself stops one byte past max.
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err // *os.PathError: the path and the errno
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: larger than the %d bytes allowed", path, max)
	}
	return b, nil
}

func fileType(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFDIR:
		return "a directory"
	}
	return fmt.Sprintf("type %#o", m&unix.S_IFMT)
}
