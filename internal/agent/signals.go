package agent

import (
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

// Signals are caught from the process's start, not from where Run gets to them: a SIGHUP
// (`systemctl reload`, a ConfigMap tool) that arrives before signal.Notify kills a Go program,
// and Run reads its config, runs the start-up checks and listens first. The package's init
// catches them when the process is a node agent (`... agent --config ...`); Run catches them
// too (a test calling Run), and handles what came meanwhile: SIGTERM or SIGINT stop it, any
// number of SIGHUPs are one reload.
var (
	sigMu     sync.Mutex
	sigCh     chan os.Signal
	sigByInit bool
)

func init() {
	if isNodeAgentArgs(os.Args) {
		catchSignals()
		sigByInit = true
	}
}

// isNodeAgentArgs: `BIN agent ... --config ...` (not a mode's agent, `BIN agent MODE --target`,
// which handles its own signals).
func isNodeAgentArgs(args []string) bool {
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

// catchSignals starts catching SIGHUP, SIGTERM and SIGINT (once) and returns their channel.
func catchSignals() <-chan os.Signal {
	sigMu.Lock()
	defer sigMu.Unlock()
	if sigCh == nil {
		sigCh = make(chan os.Signal, 16)
		signal.Notify(sigCh, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	}
	return sigCh
}

// releaseSignals gives the signals back their default action, unless init caught them (the
// process is a node agent until it exits).
func releaseSignals() {
	sigMu.Lock()
	defer sigMu.Unlock()
	if sigCh != nil && !sigByInit {
		signal.Stop(sigCh)
		sigCh = nil
	}
}
