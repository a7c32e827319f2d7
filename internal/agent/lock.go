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
// holder. The lock goes with the process (flock), so a kill -9 never leaves it behind.
func lockTarget(target, config string) (unlock func(), err error) {
	path, err := LockFile(target)
	if err != nil {
		return nil, err
	}
	f, err := safefile.OpenLock(path)
	if err != nil {
		return nil, fmt.Errorf("node agent lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			// The holder writes who it is just after it takes the lock: give it a moment.
			var who string
			for i := 0; i < 20 && who == ""; i++ {
				b := make([]byte, 512)
				n, _ := f.ReadAt(b, 0)
				if who = strings.TrimSpace(string(b[:n])); who == "" {
					time.Sleep(10 * time.Millisecond)
				}
			}
			f.Close()
			if who == "" {
				who = "starting"
			}
			return nil, fmt.Errorf("another node agent manages %s (%s; lock %s): one agent per namespace; stop that one first",
				netnsutil.Label(target), who, path)
		}
		f.Close()
		return nil, fmt.Errorf("node agent lock %s: %w", path, err)
	}
	// Who holds it, for the next agent's error.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d, config %s\n", os.Getpid(), config)), 0)
	return func() { f.Close() }, nil
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
			b := make([]byte, 512)
			n, _ := f.ReadAt(b, 0)
			f.Close()
			return strings.TrimSpace(string(b[:n]))
		}
		f.Close()
	}
	return ""
}
