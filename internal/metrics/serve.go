package metrics

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"golang.org/x/net/netutil"
)

// What one server allows. The agent runs in the host's network namespace: whoever reaches its
// port must not be able to make it use the node's CPUs, its memory or its file descriptors.
const (
	// DefaultRefresh: /metrics serves a snapshot at most this old; gathering one (which reads
	// every attachment's maps) happens at most once per DefaultRefresh, whatever the request rate.
	DefaultRefresh = 5 * time.Second
	// MaxMetricsRequests is how many /metrics requests are served at once; more get 503 at once.
	MaxMetricsRequests = 4
	// MaxCheapRequests bounds the other paths (/healthz, /readyz: a lock and a string), which
	// are kept apart so that a flood of /metrics never fails the kubelet's probes.
	MaxCheapRequests = 32
	// MaxConns bounds open connections (idle keep-alives included); more wait in the backlog.
	MaxConns = 128
	// idleScrape: with no scrape for this long the snapshot stops being refreshed.
	idleScrape = 2 * time.Minute
)

// NewServer is an http.Server with the limits above: header, body and idle timeouts, a small
// header size. Serve it on a listener from LimitListener.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 8 << 10}
}

// LimitListener bounds the connections open at once on l (MaxConns).
func LimitListener(l net.Listener) net.Listener { return netutil.LimitListener(l, MaxConns) }

// Limit serves at most n requests of h at once; a request beyond that gets 503 with
// Retry-After at once (it is not queued: a queue is what a flood fills).
func Limit(h http.Handler, n int) http.Handler {
	sem := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
			h.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy: too many requests at once", http.StatusServiceUnavailable)
		}
	})
}

// Registry is the collector plus the Go process metrics.
func Registry(c prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Snapshot serves a gatherer's metrics from a snapshot that one goroutine refreshes every
// `every` while someone scrapes: the cost of a request is copying bytes, whatever the
// gatherer reads (a flow map of any size), and the gatherer runs at most once per `every`
// however many requests come. The first scrape after an idle spell waits for one gathering
// (all the scrapes that arrive meanwhile wait for the same one).
type Snapshot struct {
	g     prometheus.Gatherer
	every time.Duration

	mu      sync.Mutex
	body    []byte
	at      time.Time     // when body was gathered; zero: none yet
	pending chan struct{} // closed when the gathering under way ends; nil when none runs
	running bool          // the refresh goroutine runs
	asked   time.Time     // the last request

	gathers atomic.Int64
	stop    chan struct{}
	once    sync.Once
}

// NewSnapshot returns a Snapshot of g refreshed every `every` (DefaultRefresh if 0).
func NewSnapshot(g prometheus.Gatherer, every time.Duration) *Snapshot {
	if every <= 0 {
		every = DefaultRefresh
	}
	return &Snapshot{g: g, every: every, stop: make(chan struct{})}
}

// Gathers is how many times the gatherer ran (tests: the work does not grow with requests).
func (s *Snapshot) Gathers() int64 { return s.gathers.Load() }

// Close stops the refresh goroutine.
func (s *Snapshot) Close() { s.once.Do(func() { close(s.stop) }) }

// ServeHTTP writes the snapshot in the Prometheus text format.
func (s *Snapshot) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := s.get(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

func (s *Snapshot) get(ctx context.Context) ([]byte, error) {
	s.mu.Lock()
	s.asked = time.Now()
	if !s.running {
		s.running = true
		go s.refreshLoop()
	}
	if !s.at.IsZero() && time.Since(s.at) < s.every+s.every/2 {
		b := s.body
		s.mu.Unlock()
		if b == nil {
			return nil, errors.New("metrics: gathering failed")
		}
		return b, nil
	}
	// None yet, or stale (the goroutine slept through an idle spell): wait for a gathering.
	wait := s.startLocked()
	s.mu.Unlock()
	select {
	case <-wait:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.body == nil {
		return nil, errors.New("metrics: gathering failed")
	}
	return s.body, nil
}

// startLocked starts a gathering unless one runs, and returns what closes when it ends.
func (s *Snapshot) startLocked() <-chan struct{} {
	if s.pending != nil {
		return s.pending
	}
	done := make(chan struct{})
	s.pending = done
	go func() {
		body := s.gather()
		s.mu.Lock()
		// A failed gathering counts as one too (the last body, if any, stays): a gatherer that
		// keeps failing must not be run again for every request.
		s.at = time.Now()
		if body != nil {
			s.body = body
		}
		s.pending = nil
		s.mu.Unlock()
		close(done)
	}()
	return done
}

func (s *Snapshot) gather() []byte {
	s.gathers.Add(1)
	mfs, err := s.g.Gather()
	if len(mfs) == 0 && err != nil {
		return nil
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if enc.Encode(mf) != nil {
			return nil
		}
	}
	return buf.Bytes()
}

// refreshLoop keeps the snapshot fresh while someone scrapes, then ends (get starts it again).
func (s *Snapshot) refreshLoop() {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if time.Since(s.asked) > idleScrape {
			s.running = false
			s.mu.Unlock()
			return
		}
		wait := s.startLocked()
		s.mu.Unlock()
		<-wait
	}
}

// Handler returns an HTTP handler serving the collector (plus the Go process metrics) on
// /metrics from a Snapshot, under Limit.
func Handler(c *Collector) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", Limit(NewSnapshot(Registry(c), 0), MaxMetricsRequests))
	mux.Handle("/", Limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("peregrine metrics: see /metrics\n"))
	}), MaxCheapRequests))
	return mux
}

// Serve listens on l until ctx ends.
func Serve(ctx context.Context, l net.Listener, c *Collector) error {
	srv := NewServer(Handler(c))
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(LimitListener(l)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
