package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
	"github.com/peregrine-net/peregrine/internal/doctor"
	"github.com/peregrine-net/peregrine/internal/metrics"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/safefile"
)

// Options are the agent's command line.
type Options struct {
	ConfigPath string
	// Netns, when NetnsSet, overrides the config file's netns (--netns).
	Netns    string
	NetnsSet bool
	// CleanupOnExit detaches everything on the target when the agent stops; by default a stop
	// leaves the datapath in place for the next agent to adopt.
	CleanupOnExit bool
	// Ready, if set, is called once the first reconcile is done (tests).
	Ready func(addr net.Addr)
}

// Agent is one running node agent.
type Agent struct {
	opts    Options
	target  string
	started time.Time

	mu       sync.Mutex
	checks   error   // doctor.Required: at start, then on every reconcile while it fails
	cfg      *Config // the config applied
	refused  string  // hash of a file refused last (not re-read until it changes again)
	cfgErr   string
	notReady map[string]string // mode -> why it is not ready
	errs     []Event
	beat     time.Time // the loop's last turn
	last     time.Time // the last reconcile

	adopted map[string]bool // modes attached or adopted by this process (upgraded, agent hosted)

	metricsRefresh time.Duration     // 0: metrics.DefaultRefresh (tests shorten it)
	snap           *metrics.Snapshot // /metrics' (tests count its gatherings)
	stopped        bool              // exited normally (the status file says so)
}

// Run runs the node agent until ctx ends or SIGTERM/SIGINT (exit 0, datapath left in place
// unless CleanupOnExit). A bad config, no root, no bpffs or a port taken are fatal at start.
func Run(ctx context.Context, o Options) error {
	// First of all: from here on a signal is handled, never fatal (signals.go).
	sigs := catchSignals()
	defer releaseSignals()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	hup := make(chan os.Signal, 1)
	sigDone := make(chan struct{})
	defer close(sigDone)
	go func() {
		for {
			select {
			case <-sigDone:
				return
			case s := <-sigs:
				if s == syscall.SIGHUP {
					select { // many SIGHUPs before the loop reads one are one reload
					case hup <- s:
					default:
					}
					continue
				}
				slog.Info("signal: stopping", "signal", s.String())
				stop()
			}
		}
	}()
	if os.Geteuid() != 0 {
		return errors.New("the agent needs root (CAP_NET_ADMIN, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)")
	}
	cfg, err := ReadConfig(o.ConfigPath)
	if err != nil {
		return err
	}
	if o.NetnsSet {
		cfg.Netns = o.Netns
	}
	if cfg.Netns != "" && !netnsutil.Exists(cfg.Netns) {
		return fmt.Errorf("netns %q does not exist (see `ip netns list`)", cfg.Netns)
	}
	// One agent per namespace, whatever name each was given: the lock is taken before
	// anything is checked, listened on or changed, and held until the process exits.
	unlock, err := lockTarget(cfg.Netns, o.ConfigPath)
	if err != nil {
		return err
	}
	defer unlock()
	if ctx.Err() != nil {
		return nil // stopped while starting: nothing was changed
	}
	a := &Agent{opts: o, target: cfg.Netns, cfg: cfg, started: time.Now(), notReady: map[string]string{},
		adopted: map[string]bool{}}
	checks, _ := doctor.Run(ctx, doctor.Target{Netns: cfg.Netns, Underlay: cfg.Underlay})
	for _, c := range checks {
		if c.Name == "bpffs" && c.Status == doctor.Fail {
			return fmt.Errorf("bpffs: %s (%s)", c.Detail, c.Fix)
		}
	}
	if a.checks = doctor.Required(checks); a.checks != nil {
		slog.Warn("start-up checks failed (see `peregrine doctor`); run again on every reconcile until they pass", "err", a.checks)
	}
	// An agent of another PID namespace and mount of /run/peregrine (not sharing the lock
	// file) is still seen by its status file, by PID only: a status file still fresh from an
	// agent killed a moment ago must not keep its restart from starting.
	if s, _ := ReadStatus(a.target); s != nil && !s.Stopped && s.PID != os.Getpid() && agentproc.IsNodeAgent(s.PID) {
		return fmt.Errorf("another node agent (pid %d, config %s) manages %s: stop it first", s.PID, s.Config, netnsutil.Label(a.target))
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if ctx.Err() != nil {
		l.Close()
		return nil
	}

	sdNotify("READY=1\nSTATUS=started: reconciling\n")

	agentproc.Host(context.Background())
	defer agentproc.StopHosting(5 * time.Second)
	srvDone := make(chan error, 1)
	srvCtx, srvStop := context.WithCancel(context.Background())
	defer func() { srvStop(); <-srvDone }()
	go func() { srvDone <- a.serve(srvCtx, l) }()

	slog.Info("node agent started", "config", o.ConfigPath, "target", netnsutil.Label(a.target),
		"modes", cfg.ModeNames(), "listen", l.Addr().String(), "interval", cfg.Interval)
	a.forgetUnconfigured(ctx)
	a.reconcile(ctx)
	if o.Ready != nil {
		o.Ready(l.Addr())
	}
	a.loop(ctx, hup)
	if o.CleanupOnExit {
		return a.cleanup()
	}
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	a.writeStatus()
	slog.Info("node agent stopping: the datapath stays in place for the next agent to adopt")
	return nil
}

func (a *Agent) loop(ctx context.Context, hup <-chan os.Signal) {
	tick := time.NewTicker(a.config().Interval)
	defer tick.Stop()
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		a.mu.Lock()
		a.beat = time.Now()
		a.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-hup:
			a.reload(ctx, "SIGHUP", tick)
		case <-poll.C:
			// A ConfigMap update swaps a symlink in the file's directory: the content (read
			// through the link) changes; comparing its hash catches that and edits alike.
			h, err := fileHash(a.opts.ConfigPath)
			switch {
			case err != nil:
			case h != a.config().Hash && h != a.refusedHash():
				a.reload(ctx, "config file changed", tick)
			case h == a.config().Hash && a.refusedHash() != "":
				// The file is the applied config again: nothing to apply, nothing refused.
				a.mu.Lock()
				a.refused, a.cfgErr = "", ""
				a.mu.Unlock()
				slog.Info("config file is the applied config again")
				a.writeStatus()
			}
		case <-tick.C:
			a.reconcile(ctx)
		}
	}
}

func (a *Agent) config() *Config {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg
}

func (a *Agent) refusedHash() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused
}

// fileHash is the hash of the config file's content. A file that cannot be read for what it is
// (a FIFO, a device, too large) hashes to its error, so that the poll reports it once (as a
// refused config) and does not try again until it changes; a missing file is an error.
func fileHash(path string) (string, error) {
	b, err := safefile.ReadRegular(path, maxConfigBytes)
	if errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err != nil {
		return "unreadable: " + err.Error(), nil
	}
	h := sha256.Sum256(b)
	return fmt.Sprintf("%x", h[:8]), nil
}

// reload reads the config again and applies the difference; an invalid config is refused
// (logged, on /readyz and in the status file) and the running state kept.
func (a *Agent) reload(ctx context.Context, why string, tick *time.Ticker) {
	cfg, err := ReadConfig(a.opts.ConfigPath)
	if err == nil && a.opts.NetnsSet {
		cfg.Netns = a.opts.Netns
	}
	if err == nil && cfg.Netns != a.target {
		err = fmt.Errorf("config %s: netns: %q -> %q cannot change while the agent runs: restart it", a.opts.ConfigPath, a.target, cfg.Netns)
	}
	if err != nil {
		h, _ := fileHash(a.opts.ConfigPath)
		a.mu.Lock()
		a.refused, a.cfgErr = h, err.Error()
		a.mu.Unlock()
		a.logErr("config refused, running state kept", err)
		a.writeStatus()
		return
	}
	old := a.config()
	if cfg.Listen != old.Listen {
		slog.Warn("listen changes at the next start", "listen", old.Listen, "configured", cfg.Listen)
	}
	a.mu.Lock()
	a.cfg, a.cfgErr, a.refused = cfg, "", ""
	a.mu.Unlock()
	slog.Info("config re-read", "why", why, "modes", cfg.ModeNames())
	tick.Reset(cfg.Interval)
	for _, m := range old.ModeNames() {
		if _, ok := cfg.Modes[m]; !ok {
			a.detach(ctx, m, "removed from the config")
		}
	}
	a.reconcile(ctx)
}

// forgetUnconfigured detaches, at start, attachments a node agent made that the config no
// longer names (removed while no agent ran). Attachments made by hand are left alone.
func (a *Agent) forgetUnconfigured(ctx context.Context) {
	sts, err := datapath.LoadStates(a.target)
	if err != nil {
		a.logErr("read records", err)
		return
	}
	for _, st := range sts {
		if _, ok := a.cfg.Modes[st.Mode]; !ok {
			if st.Managed {
				a.detach(ctx, st.Mode, "no longer in the config")
			} else {
				slog.Warn("attachment not in the config, made by hand: left alone", "mode", st.Mode)
			}
		}
	}
}

func (a *Agent) cleanup() error {
	slog.Info("node agent stopping with --cleanup-on-exit: detaching everything on the target")
	agentproc.StopHosting(5 * time.Second)
	sts, err := datapath.Detach(context.Background(), a.target, "")
	for _, st := range sts {
		slog.Info("detached", "mode", st.Mode, "knobs_restored", len(st.Knobs))
	}
	if err != nil && len(sts) == 0 && errors.Is(err, datapath.ErrNotAttached) {
		err = nil
	}
	_ = os.Remove(StatusFile(a.target))
	return err
}

func (a *Agent) logErr(msg string, err error) {
	slog.Error(msg, "err", err)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, Event{At: time.Now(), Msg: msg + ": " + err.Error()})
	if len(a.errs) > maxErrors {
		a.errs = a.errs[len(a.errs)-maxErrors:]
	}
}

// writeStatus writes the status file for `peregrine status`.
func (a *Agent) writeStatus() {
	a.mu.Lock()
	ready, why := a.readyLocked()
	s := &Status{PID: os.Getpid(), Config: a.opts.ConfigPath, ConfigHash: a.cfg.Hash, Target: a.target,
		Modes: a.cfg.ModeNames(), Listen: a.cfg.Listen, Started: a.started, LastReconcile: a.last,
		Ready: ready, NotReady: why, ConfigError: a.cfgErr, Errors: append([]Event(nil), a.errs...),
		Updated: time.Now(), Interval: a.cfg.Interval, Stopped: a.stopped}
	a.mu.Unlock()
	if err := writeStatus(s); err != nil {
		slog.Error("write status file", "err", err)
	}
}
