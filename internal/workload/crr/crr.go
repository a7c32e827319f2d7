// Package crr is TCP_CRR (netperf's, k8s-netperf's): connect, one request, one response, close,
// again, on each of several client connections in turn. The client and the server are ours, in
// the calling process: the listening socket and each client's sockets are opened inside their
// namespaces (a socket stays in the namespace it was made in). The server closes first, as an
// HTTP/1.0 server does with `Connection: close`, so TIME_WAIT stays on its side and the client
// never runs out of ports; the client reads to EOF and closes. Every response is checked byte
// for byte.
package crr

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Request is the request's size in bytes; the response is Config.Response bytes.
const Request = 64

// Result is one crr measurement.
type Result struct {
	Connections int     `json:"connections"` // completed (connect, request, response, close)
	Failures    int     `json:"failures"`    // connect, write or read errors, short or wrong responses
	DurationS   float64 `json:"duration_s"`
	PerSec      float64 `json:"connections_per_s"`
	P50Us       float64 `json:"p50_us"` // connect+request+response+close, one connection
	P90Us       float64 `json:"p90_us"`
	P99Us       float64 `json:"p99_us"`
	FirstError  string  `json:"first_error,omitempty"`
}

// Config is one run.
type Config struct {
	ServerNS, Listen  string // namespace and address:port of the server
	ClientNS, Connect string // namespace of the clients, and where they connect (a ClusterIP, or Listen)
	Clients           int    // concurrent clients, each one connection at a time
	Response          int    // response bytes
	Duration          time.Duration
	Count             int // stop after this many connections in all (0: Duration only)
}

// Run runs the server and the clients until Duration (or Count connections) and returns the
// rate and latency percentiles. Failures are counted, not fatal: the caller asserts on them.
func Run(ctx context.Context, c Config) (Result, error) {
	var res Result
	if c.Clients < 1 {
		c.Clients = 1
	}
	sns, err := netnsutil.Open(c.ServerNS)
	if err != nil {
		return res, err
	}
	defer sns.Close()
	cns, err := netnsutil.Open(c.ClientNS)
	if err != nil {
		return res, err
	}
	defer cns.Close()
	var ln net.Listener
	if err := sns.Do(func() error {
		var err error
		lc := net.ListenConfig{}
		ln, err = lc.Listen(ctx, "tcp", c.Listen) // the address literal picks the family (IPv6 pods too)
		return err
	}); err != nil {
		return res, fmt.Errorf("crr: listen on %s in %s: %w", c.Listen, c.ServerNS, err)
	}
	defer ln.Close()
	var srv sync.WaitGroup
	srv.Add(1)
	go func() { // server: read the request, answer, close first
		defer srv.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				req := make([]byte, Request)
				if _, err := io.ReadFull(conn, req); err != nil {
					return
				}
				_, _ = conn.Write(response(req, c.Response))
			}()
		}
	}()

	ctx, cancel := context.WithTimeout(ctx, c.Duration)
	defer cancel()
	var done, failed, started atomic.Int64
	var firstErr atomic.Value
	lats := make([][]time.Duration, c.Clients)
	var cli sync.WaitGroup
	start := time.Now()
	for i := range c.Clients {
		cli.Add(1)
		go func() {
			defer cli.Done()
			_ = cns.Do(func() error {
				req := make([]byte, Request)
				buf := make([]byte, c.Response+1)
				d := net.Dialer{Timeout: 2 * time.Second}
				for ctx.Err() == nil {
					id := started.Add(1)
					if c.Count > 0 && id > int64(c.Count) {
						return nil
					}
					binary.LittleEndian.PutUint64(req, uint64(id))
					for j := 8; j < Request; j++ {
						req[j] = byte(id>>3) + byte(j)
					}
					t0 := time.Now()
					n, err := crrOnce(ctx, &d, c.Connect, req, buf)
					if err == nil && (n != c.Response || !bytes.Equal(buf[:n], response(req, c.Response))) {
						err = fmt.Errorf("connection %d: a response of %d bytes, not the %d the request asked", id, n, c.Response)
					}
					if err != nil {
						// The run's end: a dial cut by its deadline reports "i/o timeout"
						// a moment before ctx says it is done.
						if dl, _ := ctx.Deadline(); ctx.Err() != nil || !time.Now().Before(dl) {
							return nil
						}
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					lats[i] = append(lats[i], time.Since(t0))
					done.Add(1)
				}
				return nil
			})
		}()
	}
	cli.Wait()
	el := time.Since(start)
	ln.Close()
	srv.Wait()
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	res.Connections, res.Failures, res.DurationS = int(done.Load()), int(failed.Load()), el.Seconds()
	res.PerSec = float64(res.Connections) / el.Seconds()
	res.P50Us, res.P90Us, res.P99Us = pctUs(all, 0.50), pctUs(all, 0.90), pctUs(all, 0.99)
	if e, ok := firstErr.Load().(string); ok {
		res.FirstError = e
	}
	if res.Connections == 0 {
		return res, errors.New("crr: no connection completed: " + res.FirstError)
	}
	return res, nil
}

// crrOnce is one connection: connect, request, the whole response, close. It returns the
// response's length.
func crrOnce(ctx context.Context, d *net.Dialer, addr string, req, buf []byte) (int, error) {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write(req); err != nil {
		return 0, err
	}
	n := 0
	for {
		if n == len(buf) {
			return n, errors.New("response longer than asked")
		}
		k, err := conn.Read(buf[n:])
		n += k
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// response is what the server answers req with: size bytes that depend on every byte of the
// request, so a response delivered to the wrong connection or damaged shows.
func response(req []byte, size int) []byte {
	out := make([]byte, size)
	for i := range out {
		out[i] = req[i%len(req)] ^ byte(i*7)
	}
	return out
}

func pctUs(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return float64(sorted[i].Nanoseconds()) / 1e3
}
