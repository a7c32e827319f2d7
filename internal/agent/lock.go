package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/safefile"
)

// LockFile is the lock a node agent holds for as long as it runs, one per network namespace
// (by identity: `--netns prg-x-h1` and `--netns /run/netns/prg-x-h1` are one lock), under
// /run/peregrine so that agents of every kind on a node (systemd, a DaemonSet pod, one by hand)
// share it. The status file cannot serve: it is written after the first reconcile, so two
// agents started together both found none.
func LockFile(target string) (string, error) {
	id, ok := datapath.NamespaceID(target)
	if !ok {
		return "", fmt.Errorf("netns %q: cannot read its identity (gone?)", target)
	}
	return filepath.Join(datapath.NodeAgentDir, "ns-"+strings.ReplaceAll(id, ":", "-")+".lock"), nil
}

// lockTarget takes target's lock without waiting; held, it returns an error that names the
// holder. The lock goes with the process (flock), so a kill -9 never leaves it behind; a clean
// exit also removes the file (no file per namespace ever seen piles up under /run/peregrine).
func lockTarget(target, config string) (unlock func(), err error) {
	path, err := LockFile(target)
	if err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		f, err := safefile.OpenLock(path)
		if err != nil {
			return nil, fmt.Errorf("node agent lock: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			defer f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("another node agent manages %s (%s; lock %s): one agent per namespace; stop that one first",
					netnsutil.Label(target), holder(f), path)
			}
			return nil, fmt.Errorf("node agent lock %s: %w", path, err)
		}
		// The holder before us may have removed the file as it exited, after we opened it: a
		// lock on a file no longer at path excludes no one. Open again.
		var fst, pst syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &fst) != nil || syscall.Stat(path, &pst) != nil || fst.Ino != pst.Ino || fst.Dev != pst.Dev {
			f.Close()
			if try < 5 {
				continue
			}
			return nil, fmt.Errorf("node agent lock %s keeps changing under us", path)
		}
		// Who holds it, for the next agent's error.
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d, config %s\n", os.Getpid(), config)), 0)
		return func() {
			_ = safefile.Remove(path) // still holding the lock: see the inode check above
			f.Close()
		}, nil
	}
}

// holder is who wrote the lock file; the holder writes it just after it takes the lock, so
// give it a moment.
func holder(f *os.File) string {
	for i := 0; i < 20; i++ {
		b := make([]byte, 512)
		n, _ := f.ReadAt(b, 0)
		if who := strings.TrimSpace(string(b[:n])); who != "" {
			return who
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "starting"
}

// lockedByAgent names a node agent that holds its lock on this machine ("" if none does): the
// lock is a running agent's, whatever PID namespace it runs in.
func lockedByAgent() string {
	ents, _ := os.ReadDir(datapath.NodeAgentDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "ns-") || !strings.HasSuffix(e.Name(), ".lock") {
			continue
		}
		f, err := safefile.OpenLock(filepath.Join(datapath.NodeAgentDir, e.Name()))
		if err != nil {
			continue
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			defer f.Close()
			return holder(f)
		}
		f.Close()
	}
	return ""
}
