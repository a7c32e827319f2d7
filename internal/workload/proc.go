package workload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// tailBuffer keeps at most max bytes of what is written to it (the newest bytes), so a
// chatty long-running server cannot grow our memory without bound.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int // 0 means unbounded (client output we must parse in full)
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if t.max > 0 && len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.Clone(t.buf))
}

// proc is one tool process running in a namespace, in its own process group.
type proc struct {
	tool   string
	ns     string
	cmd    *exec.Cmd
	stdout *tailBuffer
	stderr *tailBuffer
	done   chan struct{} // closed once the process is reaped
	err    error         // Wait's result, valid after done
}

// startProc starts argv in namespace ns, optionally pinned with `taskset -c cpus`.
//
// The process gets its own process group (so stop can kill helpers it forks, e.g. nginx
// workers) and SIGKILL as parent-death signal (so nothing outlives a crashed peregrine).
// Pdeathsig fires when the *thread* that forked the child exits, and Go may retire threads
// (e.g. one that ran namespace code locked and exited). So the fork happens on a goroutine
// locked to its thread that stays there, blocked in Wait, until the child is reaped.
func startProc(ns, tool, cpus string, argv []string, outMax int) (*proc, error) {
	if cpus != "" {
		argv = append([]string{"taskset", "-c", cpus}, argv...)
	}
	p := &proc{
		tool:   tool,
		ns:     ns,
		stdout: &tailBuffer{max: outMax},
		stderr: &tailBuffer{max: 64 << 10},
		done:   make(chan struct{}),
	}
	// Background context: lifetime is managed by stop, never by exec's own cancel (which
	// would kill only the leader and not the group).
	p.cmd = netnsutil.Command(context.Background(), ns, argv...)
	p.cmd.Stdout = p.stdout
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// If a grandchild keeps our pipes open after the group is killed, do not hang in Wait.
	p.cmd.WaitDelay = 2 * time.Second

	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread must outlive the child (see above)
		if err := p.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("%s (%s): start %q: %w", tool, netnsutil.Label(ns), strings.Join(argv, " "), err)
	}
	return p, nil
}

// exited reports whether the process has already been reaped.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop kills the whole process group and waits until the leader is reaped. It is safe to
// call more than once and after the process has exited on its own.
func (p *proc) stop() {
	if p == nil {
		return
	}
	// Negative pid: the whole group, also after the leader exited on its own, because forked
	// helpers (nginx workers) may still be there. ESRCH just means the group is gone.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		// Should not happen: SIGKILL cannot be caught. Nothing more we can do here.
	}
}

// exitedWithin reports whether the process is reaped within d. Used after a client error,
// when the server's death (the likely cause) may not have been reaped yet.
func (p *proc) exitedWithin(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// fail wraps err with the tool, namespace and the process's recent output.
func (p *proc) fail(err error) error {
	return toolError(p.tool, p.ns, err, p.stderr.String(), p.stdout.String())
}

// exitError describes how a reaped process ended.
func (p *proc) exitError() error {
	if p.err == nil {
		return errors.New("exited unexpectedly with status 0")
	}
	return fmt.Errorf("exited: %w", p.err)
}

// runClient runs a client tool to completion with a deadline of nominal+clientMargin. It
// returns its full stdout and stderr. A non-zero exit, a stall or ctx cancellation is an
// error naming the tool, namespace and stderr tail; in every case the process group is
// killed and reaped before runClient returns.
func runClient(ctx context.Context, ns, tool, cpus string, argv []string, nominal time.Duration) (stdout, stderr string, err error) {
	p, err := startProc(ns, tool, cpus, argv, 0)
	if err != nil {
		return "", "", err
	}
	defer p.stop()
	limit := nominal + clientMargin
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		p.stop()
		return p.stdout.String(), p.stderr.String(), p.fail(fmt.Errorf("stalled: no result after %s", limit))
	case <-ctx.Done():
		p.stop()
		return p.stdout.String(), p.stderr.String(), p.fail(fmt.Errorf("cancelled: %w", context.Cause(ctx)))
	}
	stdout, stderr = p.stdout.String(), p.stderr.String()
	if p.err != nil {
		return stdout, stderr, p.fail(fmt.Errorf("failed: %w", p.err))
	}
	return stdout, stderr, nil
}

// startServer starts a server tool and waits until it listens on port (proto "tcp" or
// "udp"), bounded by readyTimeout and ctx. On any failure the server is already stopped.
func startServer(ctx context.Context, ns, tool, cpus string, argv []string, proto string, port int) (*proc, error) {
	p, err := startProc(ns, tool, cpus, argv, 1<<20)
	if err != nil {
		return nil, err
	}
	if err := waitListening(ctx, p, proto, port); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// waitListening polls the namespace's socket tables until something listens on port. It
// gives up early when the server process dies (e.g. the port is taken).
func waitListening(ctx context.Context, p *proc, proto string, port int) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		ok, err := listening(p.ns, proto, port)
		if err != nil {
			return p.fail(fmt.Errorf("check %s port %d: %w", proto, port, err))
		}
		if ok {
			return nil
		}
		if p.exited() {
			return p.fail(fmt.Errorf("exited before listening on %s port %d: %w", proto, port, p.exitError()))
		}
		if time.Now().After(deadline) {
			return p.fail(fmt.Errorf("not listening on %s port %d after %s", proto, port, readyTimeout))
		}
		select {
		case <-ctx.Done():
			return p.fail(fmt.Errorf("cancelled while waiting for %s port %d: %w", proto, port, context.Cause(ctx)))
		case <-time.After(20 * time.Millisecond):
		}
	}
}
