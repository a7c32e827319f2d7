package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
	"github.com/peregrine-net/peregrine/internal/doctor"
)

// reconcile brings every configured mode to its config on the target, and records why a mode
// is not ready. It changes only what differs: an attachment whose record holds the configured
// config is kept (adopted, on a start), a drifted knob is written again, a vanished piece put
// back; a mode whose config changed is changed live where the mode can (prism's rules), else
// detached and attached.
func (a *Agent) reconcile(ctx context.Context) {
	cfg := a.config()
	a.mu.Lock()
	failing := a.checks != nil
	a.mu.Unlock()
	if failing {
		// Start-up checks that failed are run again until they pass: an overlay that comes up
		// after the agent (a CNI starting later on a new node) must not leave it unready.
		checks, _ := doctor.Run(ctx, doctor.Target{Netns: cfg.Netns, Underlay: cfg.Underlay})
		err := doctor.Required(checks)
		a.mu.Lock()
		a.checks = err
		a.mu.Unlock()
		if err == nil {
			slog.Info("start-up checks pass now")
		}
	}
	notReady := map[string]string{}
	for _, m := range cfg.ModeNames() {
		if ctx.Err() != nil {
			return
		}
		if err := a.reconcileMode(ctx, cfg, m); err != nil {
			a.logErr(m, err)
			notReady[m] = err.Error()
		} else if why := a.modeNotReady(cfg, m); why != "" {
			notReady[m] = why
		}
	}
	a.mu.Lock()
	a.notReady, a.last = notReady, time.Now()
	a.mu.Unlock()
	a.writeStatus()
}

func (a *Agent) reconcileMode(ctx context.Context, cfg *Config, m string) error {
	st, err := datapath.LoadState(a.target, m)
	if err != nil {
		return err
	}
	switch {
	case st == nil:
		return a.attach(ctx, cfg, m, "not attached")
	case !st.Complete:
		return a.reattach(ctx, cfg, m, "its record is incomplete (an attach was interrupted)")
	case !sameConfig(st, cfg, m):
		if done, err := a.applyLive(ctx, cfg, m, st); done || err != nil {
			return err
		}
		return a.reattach(ctx, cfg, m, "its config changed")
	}
	if !a.adopted[m] {
		if err := a.adopt(ctx, cfg, m, st); err != nil {
			return err
		}
		if st, err = datapath.LoadState(a.target, m); err != nil || st == nil {
			return errors.Join(errors.New("record gone during adoption"), err)
		}
	}
	if st.AgentPID > 0 {
		if running, err := agentproc.HostedErr(m, a.target); !running {
			slog.Warn("the mode's agent is not running: starting it again", "mode", m, "ended_with", err)
			if err := agentproc.Adopt(st); err != nil {
				return fmt.Errorf("restart its agent: %w", err)
			}
		}
	}
	if drifted := datapath.DriftedKnobs(st); len(drifted) > 0 {
		for _, k := range drifted {
			slog.Warn("knob changed by hand: writing it again", "mode", m, "knob", k.String(),
				"live", datapath.CurrentValue(k), "set", k.New)
		}
		if err := datapath.ApplyKnobs(drifted, false); err != nil {
			return fmt.Errorf("rewrite knobs: %w", err)
		}
	}
	return a.repair(ctx, cfg, m, st)
}

// repair puts back pieces of m that vanished: the mode's own Repair where it has one (only the
// missing pieces), else a detach and attach of the mode when one of its pins is gone.
func (a *Agent) repair(ctx context.Context, cfg *Config, m string, st *datapath.State) error {
	mode, err := datapath.Lookup(m)
	if err != nil {
		return err
	}
	if r, ok := mode.(datapath.Repairer); ok {
		back, err := r.Repair(ctx, st)
		if len(back) > 0 {
			slog.Warn("pieces had vanished: put back", "mode", m, "pieces", back)
		}
		return err
	}
	if missing := datapath.MissingPins(st); len(missing) > 0 {
		return a.reattach(ctx, cfg, m, "pins vanished: "+strings.Join(missing, ", "))
	}
	return nil
}

// adopt takes over an attachment found recorded with the configured config: its programs are
// upgraded in place when this binary's differ (modes that can: fastpath), then its agent runs
// in this process. Nothing is detached.
func (a *Agent) adopt(ctx context.Context, cfg *Config, m string, st *datapath.State) error {
	mode, err := datapath.Lookup(m)
	if err != nil {
		return err
	}
	// Modes without an Upgrader keep the programs they were attached with until they are
	// detached and attached (a config change, or by hand): their programs are not replaced
	// on upgrade.
	if u, ok := mode.(datapath.Upgrader); ok {
		replaced, err := u.Upgrade(ctx, st)
		if errors.Is(err, datapath.ErrNeedsReattach) {
			return a.reattach(ctx, cfg, m, err.Error())
		}
		if err != nil {
			return fmt.Errorf("upgrade its programs: %w", err)
		}
		if len(replaced) > 0 {
			slog.Info("programs of an older binary replaced atomically (link update)", "mode", m, "links", replaced)
		}
	}
	if err := agentproc.Adopt(st); err != nil {
		return err
	}
	if err := datapath.SetManaged(a.target, m, true); err != nil {
		return err
	}
	a.adopted[m] = true
	slog.Info("adopted the attachment on record (nothing detached or attached)", "mode", m, "since", st.Attached.Format(time.RFC3339))
	return nil
}

func (a *Agent) attach(ctx context.Context, cfg *Config, m, why string) error {
	slog.Info("attaching", "mode", m, "why", why)
	st, err := datapath.Attach(ctx, a.target, m, cfg.Options(m))
	if err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	if err := datapath.SetManaged(a.target, m, true); err != nil {
		return err
	}
	a.adopted[m] = true
	slog.Info("attached", "mode", m, "devices", len(st.Topology.Devs), "knobs", len(st.Knobs))
	return nil
}

func (a *Agent) detach(ctx context.Context, m, why string) {
	slog.Info("detaching", "mode", m, "why", why)
	delete(a.adopted, m)
	if _, err := datapath.Detach(ctx, a.target, m); err != nil {
		a.logErr("detach "+m, err)
	}
}

func (a *Agent) reattach(ctx context.Context, cfg *Config, m, why string) error {
	slog.Warn("detaching and attaching again", "mode", m, "why", why)
	delete(a.adopted, m)
	if _, err := datapath.Detach(ctx, a.target, m); err != nil {
		return fmt.Errorf("detach: %w", err)
	}
	return a.attach(ctx, cfg, m, why)
}

// applyLive applies a changed config to a live attachment where the mode can.
func (a *Agent) applyLive(ctx context.Context, cfg *Config, m string, st *datapath.State) (bool, error) {
	mode, err := datapath.Lookup(m)
	if err != nil {
		return false, err
	}
	lc, ok := mode.(datapath.LiveConfigurer)
	if !ok || !sameFramework(st, cfg) {
		return false, nil
	}
	next, err := datapath.Configure(m, cfg.Options(m))
	if err != nil {
		return false, err
	}
	done, err := lc.ApplyConfig(ctx, st, next)
	if done && err == nil {
		slog.Info("config change applied live (nothing detached)", "mode", m)
	}
	return done, err
}

// modeNotReady says why a mode that reconciled without an error is still not ready ("" if it
// is): every configured mode attached with its config, complete, its agent running.
func (a *Agent) modeNotReady(cfg *Config, m string) string {
	st, err := datapath.LoadState(a.target, m)
	switch {
	case err != nil:
		return err.Error()
	case st == nil:
		return "not attached"
	case !st.Complete:
		return "attach incomplete"
	case !sameConfig(st, cfg, m):
		return "attached with another config"
	}
	if st.AgentPID > 0 {
		if running, _ := agentproc.HostedErr(m, a.target); !running {
			return "its agent is not running"
		}
	}
	if missing := datapath.MissingPins(st); len(missing) > 0 {
		return "pins missing: " + strings.Join(missing, ", ")
	}
	return ""
}

// sameConfig tells whether st was attached with what cfg configures for m.
func sameConfig(st *datapath.State, cfg *Config, m string) bool {
	return sameFramework(st, cfg) && sameJSON(st.Config, cfg.Modes[m].Typed)
}

func sameFramework(st *datapath.State, cfg *Config) bool {
	return st.Options.Underlay == cfg.Underlay && slices.Equal(st.Options.CPUs, cfg.CPUs) && !st.Options.KeepUnderlay
}

func sameJSON(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}
