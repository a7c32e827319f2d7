package agent

import (
	"os"

	"github.com/peregrine-net/peregrine/internal/agent/earlysig"
)

// Signals are caught from the process's start (earlysig's init), not from where Run gets to
// them: Run reads its config, runs the start-up checks and listens first, and a SIGHUP
// (`systemctl reload`, a config tool) before signal.Notify kills a Go program. Run catches them
// too (a test calling Run), and handles what came meanwhile: SIGTERM or SIGINT stop it, any
// number of SIGHUPs are one reload.
func catchSignals() <-chan os.Signal { return earlysig.Catch() }

func releaseSignals() { earlysig.Release() }
