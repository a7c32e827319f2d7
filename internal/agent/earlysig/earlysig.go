// Package earlysig catches SIGHUP, SIGTERM and SIGINT for a node agent (`BIN agent ...
// --config ...`) as early as a Go program can: in a package init that depends on nothing but
// os/signal, so that it runs as soon as os/signal is initialized, before the large packages'
// inits (milliseconds on a loaded node). Until signal.Notify, a SIGHUP kills a Go program; the
// moments between exec and this init are closed only from outside: systemd sends the reload's
// SIGHUP after READY=1 (Type=notify, which the agent sends once it handles signals), and a
// supervisor may start it with SIGHUP ignored (inherited across exec; the Go runtime keeps an
// inherited SIG_IGN of SIGHUP until signal.Notify).
package earlysig

import (
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

var (
	mu     sync.Mutex
	ch     chan os.Signal
	byInit bool
)

func init() {
	if isNodeAgent(os.Args) {
		Catch()
		byInit = true
	}
}

// isNodeAgent: `BIN agent ... --config ...` (not a mode's agent, `BIN agent MODE --target`,
// which handles its own signals).
func isNodeAgent(args []string) bool {
	if len(args) < 3 || args[1] != "agent" {
		return false
	}
	for _, a := range args[2:] {
		if a == "--config" || strings.HasPrefix(a, "--config=") {
			return true
		}
	}
	return false
}

// Catch starts catching SIGHUP, SIGTERM and SIGINT (once) and returns their channel: what
// came since the start is waiting in it.
func Catch() <-chan os.Signal {
	mu.Lock()
	defer mu.Unlock()
	if ch == nil {
		ch = make(chan os.Signal, 16)
		signal.Notify(ch, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	}
	return ch
}

// Release gives the signals back their default action, unless init caught them (the process is
// a node agent until it exits).
func Release() {
	mu.Lock()
	defer mu.Unlock()
	if ch != nil && !byInit {
		signal.Stop(ch)
		ch = nil
	}
}
