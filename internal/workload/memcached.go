package workload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// MemcachedConfig describes a memcached run: the server in ServerNS and a closed-loop load
// client in ClientNS with Connections connections, each with one request in flight.
//
// The client is in-process Go (memcache_client.go), not memcslap/memcaslap: memcslap only
// reports total time, memcaslap only min/avg/max and a log2 histogram, so neither gives a
// usable p99, which is the number the FALCON/EZPath comparisons need.
type MemcachedConfig struct {
	ServerNS    string        `json:"server_ns"`
	ServerAddr  string        `json:"server_addr"`
	ClientNS    string        `json:"client_ns"`
	Port        int           `json:"port"`        // default 11211
	Duration    time.Duration `json:"duration_ns"` // measured period, after preload; default 10 s
	Threads     int           `json:"threads"`     // memcached -t; default 1
	MemoryMB    int           `json:"memory_mb"`   // memcached -m; default 64
	Connections int           `json:"connections"` // default 8
	Keys        int           `json:"keys"`        // key space, preloaded; default 10000
	ValueSize   int           `json:"value_size"`  // bytes; default 64
	GetRatio    float64       `json:"get_ratio"`   // share of gets, 0..1; default 0.9 (memcaslap's)
	ServerCPUs  string        `json:"server_cpus,omitempty"`
	// ClientCPUs pins the client's worker threads (sched_setaffinity), as taskset would.
	ClientCPUs string `json:"client_cpus,omitempty"`
}

// MemcachedResult is the client's view: throughput and per-request latency, measured from
// just before the request is written until its whole reply is read.
type MemcachedResult struct {
	Client      string  `json:"client"`
	Connections int     `json:"connections"`
	ValueSize   int     `json:"value_size"`
	GetRatio    float64 `json:"get_ratio"`
	DurationS   float64 `json:"duration_s"`
	Ops         int64   `json:"ops"`
	Gets        int64   `json:"gets"`
	Sets        int64   `json:"sets"`
	GetMisses   int64   `json:"get_misses"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	AvgUs       float64 `json:"avg_us"`
	MinUs       float64 `json:"min_us"`
	P50Us       float64 `json:"p50_us"`
	P90Us       float64 `json:"p90_us"`
	P99Us       float64 `json:"p99_us"`
	P999Us      float64 `json:"p99_9_us"`
	MaxUs       float64 `json:"max_us"`
}

func (c *MemcachedConfig) defaults() error {
	c.Port = cmp.Or(c.Port, 11211)
	c.Duration = cmp.Or(c.Duration, 10*time.Second)
	c.Threads = cmp.Or(c.Threads, 1)
	c.MemoryMB = cmp.Or(c.MemoryMB, 64)
	c.Connections = cmp.Or(c.Connections, 8)
	c.Keys = cmp.Or(c.Keys, 10000)
	c.ValueSize = cmp.Or(c.ValueSize, 64)
	c.GetRatio = cmp.Or(c.GetRatio, 0.9)
	switch {
	case c.ServerAddr == "":
		return errors.New("memcached: server address is required")
	case c.GetRatio < 0 || c.GetRatio > 1:
		return fmt.Errorf("memcached: get ratio %g outside 0..1", c.GetRatio)
	case c.ValueSize < 1 || c.ValueSize > 1<<20:
		return fmt.Errorf("memcached: value size %d outside 1..1048576", c.ValueSize)
	case c.Connections < 1 || c.Connections > 256:
		// Each connection is a thread (see fdConn); beyond that use more client namespaces.
		return fmt.Errorf("memcached: connections %d outside 1..256", c.Connections)
	}
	return nil
}

// Run starts memcached, preloads the key space, then drives the get/set mix for Duration.
func (c MemcachedConfig) Run(ctx context.Context) (MemcachedResult, error) {
	if err := prepare(c.defaults, c.ServerNS, c.ClientNS); err != nil {
		return MemcachedResult{}, err
	}
	cpus, err := parseCPUList(c.ClientCPUs)
	if err != nil {
		return MemcachedResult{}, fmt.Errorf("memcached client: %w", err)
	}
	argv := []string{"memcached", "-l", c.ServerAddr, "-p", strconv.Itoa(c.Port), "-U", "0",
		"-t", strconv.Itoa(c.Threads), "-m", strconv.Itoa(c.MemoryMB), "-c", "4096"}
	if os.Geteuid() == 0 {
		argv = append(argv, "-u", "root") // memcached refuses to run as root without it
	}
	srv, err := startServer(ctx, c.ServerNS, "memcached", c.ServerCPUs, argv, "tcp", c.Port)
	if err != nil {
		return MemcachedResult{}, err
	}
	defer srv.stop()

	conns, err := dialBlocking(c.ClientNS, c.ServerAddr, c.Port, c.Connections, c.Duration+clientMargin)
	if err != nil {
		return MemcachedResult{}, toolError("memcached client", c.ClientNS, err, srv.stderr.String(), "")
	}
	defer closeConns(conns)
	defer raiseGOMAXPROCS(len(conns))()
	res, err := runMemcacheLoad(ctx, conns, c, cpus)
	if err != nil {
		if srv.exitedWithin(200 * time.Millisecond) {
			err = fmt.Errorf("%w; server: %v", err, srv.fail(srv.exitError()))
		}
		return MemcachedResult{}, toolError("memcached client", c.ClientNS, err, "", "")
	}
	return res, nil
}

// runMemcacheLoad preloads every key, then runs one closed-loop worker per connection until
// the measured period ends. ctx cancellation shuts the sockets down to wake the workers.
func runMemcacheLoad(ctx context.Context, conns []*fdConn, c MemcachedConfig, cpus []int) (MemcachedResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		for _, conn := range conns {
			conn.shutdown()
		}
	}()

	value := make([]byte, c.ValueSize)
	for i := range value {
		value[i] = 'a' + byte(i%26)
	}

	// Preload in parallel, key i on connection i mod n, so gets hit from the first request.
	err := forEachConn(conns, cpus, func(i int, mc *memcacheConn) error {
		for k := i; k < c.Keys; k += len(conns) {
			if err := mc.set(memcacheKey(k), value); err != nil {
				return fmt.Errorf("preload: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return MemcachedResult{}, ctxErr(ctx, err)
	}

	workers := make([]memcacheWorker, len(conns))
	start := time.Now()
	end := start.Add(c.Duration)
	err = forEachConn(conns, cpus, func(i int, mc *memcacheConn) error {
		return workers[i].run(mc, end, c.Keys, c.GetRatio, value, uint64(i))
	})
	elapsed := time.Since(start)
	if err != nil {
		return MemcachedResult{}, ctxErr(ctx, err)
	}

	var h latencyHist
	r := MemcachedResult{
		Client: "peregrine-go-blocking-text-protocol", Connections: len(conns), ValueSize: c.ValueSize,
		GetRatio: c.GetRatio, DurationS: elapsed.Seconds(),
	}
	for i := range workers {
		w := &workers[i]
		h.merge(&w.hist)
		r.Gets += w.gets
		r.Sets += w.sets
		r.GetMisses += w.misses
	}
	r.Ops = r.Gets + r.Sets
	if r.Ops == 0 {
		return r, errors.New("no request completed")
	}
	r.OpsPerSec = float64(r.Ops) / elapsed.Seconds()
	r.AvgUs, r.MinUs, r.MaxUs = h.meanUs(), float64(h.min)/1e3, float64(h.max)/1e3
	r.P50Us, r.P90Us, r.P99Us, r.P999Us = h.quantileUs(0.5), h.quantileUs(0.9), h.quantileUs(0.99), h.quantileUs(0.999)
	return r, nil
}

// ctxErr prefers the cancellation cause over the I/O error it provoked (closed connection).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("cancelled: %w (%v)", context.Cause(ctx), err)
	}
	return err
}

// forEachConn runs fn on every connection in its own goroutine (pinned to cpus if given;
// the blocking reads then keep each worker on its own thread anyway)
// and waits for all of them.
func forEachConn(conns []*fdConn, cpus []int, fn func(i int, mc *memcacheConn) error) error {
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if len(cpus) > 0 {
				if err := pinThread(cpus); err != nil {
					errs[i] = err
					return
				}
			}
			errs[i] = fn(i, newMemcacheConn(conn))
		}()
	}
	wg.Wait()
	// Report the first failure only: when the server dies every worker fails the same way.
	var first error
	n := 0
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("%w (%d of %d connections failed)", first, n, len(errs))
	}
	return first
}
