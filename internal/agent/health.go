package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/metrics"
)

// serve answers /healthz, /readyz and /metrics on l until ctx ends. Whoever reaches the port
// (with a listen other than loopback: any pod of the node) must not be able to make the agent
// work: /metrics is a snapshot gathered at most once per metrics.DefaultRefresh by one
// goroutine, at most metrics.MaxMetricsRequests are served at once and the probes' paths have
// their own bound (a /metrics flood never fails them), with the server's timeouts and
// connection cap (metrics.NewServer, metrics.LimitListener).
func (a *Agent) serve(ctx context.Context, l net.Listener) error {
	snap := metrics.NewSnapshot(metrics.Registry(metrics.New(nil)), a.metricsRefresh)
	defer snap.Close()
	a.mu.Lock()
	a.snap = snap
	a.mu.Unlock()
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Limit(snap, metrics.MaxMetricsRequests))
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if why := a.alive(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	probes.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		ok, why := a.readyLocked()
		a.mu.Unlock()
		if !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("/", metrics.Limit(probes, metrics.MaxCheapRequests))
	srv := metrics.NewServer(mux)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(metrics.LimitListener(l)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// alive is "" while the loop turns: its last turn is recent (a reconcile that attaches takes
// seconds, so the bound is generous).
func (a *Agent) alive() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	limit := max(30*time.Second, 3*a.cfg.Interval)
	if since := time.Since(a.beat); !a.beat.IsZero() && since > limit {
		return fmt.Sprintf("the agent's loop has not turned for %s", since.Round(time.Second))
	}
	return ""
}

// readyLocked: every configured mode attached with its programs, the start-up checks passed,
// the last config accepted. a.mu is held.
func (a *Agent) readyLocked() (bool, string) {
	var why []string
	if a.last.IsZero() {
		why = append(why, "first reconcile not done")
	}
	if a.checks != nil {
		why = append(why, "start-up checks: "+a.checks.Error())
	}
	if a.cfgErr != "" {
		why = append(why, "config refused (running state kept): "+a.cfgErr)
	}
	var modes []string
	for m := range a.notReady {
		modes = append(modes, m)
	}
	sort.Strings(modes)
	for _, m := range modes {
		why = append(why, m+": "+a.notReady[m])
	}
	return len(why) == 0, strings.Join(why, "; ")
}
