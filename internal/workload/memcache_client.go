package workload

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// memcacheConn speaks the memcached text protocol on one connection, one request at a time.
type memcacheConn struct {
	r *bufio.Reader
	w *bufio.Writer
}

func newMemcacheConn(c io.ReadWriter) *memcacheConn {
	return &memcacheConn{r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
}

func memcacheKey(k int) string { return "prg:" + strconv.Itoa(k) }

// set stores value under key and expects STORED.
func (m *memcacheConn) set(key string, value []byte) error {
	fmt.Fprintf(m.w, "set %s 0 0 %d\r\n", key, len(value))
	m.w.Write(value)
	m.w.WriteString("\r\n")
	if err := m.w.Flush(); err != nil {
		return fmt.Errorf("set %s: %w", key, err)
	}
	line, err := m.readLine()
	if err != nil {
		return fmt.Errorf("set %s: %w", key, err)
	}
	if line != "STORED" {
		return fmt.Errorf("set %s: server replied %q", key, line)
	}
	return nil
}

// get fetches key; hit reports whether it was there.
func (m *memcacheConn) get(key string) (hit bool, err error) {
	m.w.WriteString("get " + key + "\r\n")
	if err := m.w.Flush(); err != nil {
		return false, fmt.Errorf("get %s: %w", key, err)
	}
	line, err := m.readLine()
	if err != nil {
		return false, fmt.Errorf("get %s: %w", key, err)
	}
	if line == "END" {
		return false, nil
	}
	// VALUE <key> <flags> <bytes>
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "VALUE" {
		return false, fmt.Errorf("get %s: server replied %q", key, line)
	}
	n, err := strconv.Atoi(f[3])
	if err != nil || n < 0 {
		return false, fmt.Errorf("get %s: bad length in %q", key, line)
	}
	if _, err := m.r.Discard(n + 2); err != nil { // data + CRLF
		return false, fmt.Errorf("get %s: read value: %w", key, err)
	}
	if line, err = m.readLine(); err != nil || line != "END" {
		return false, fmt.Errorf("get %s: expected END, got %q (%v)", key, line, err)
	}
	return true, nil
}

func (m *memcacheConn) readLine() (string, error) {
	b, err := m.r.ReadSlice('\n')
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // the server closed the connection mid-run
		}
		return "", err
	}
	return string(bytes.TrimRight(b, "\r\n")), nil
}

// memcacheWorker is one closed-loop client: it sends the next request as soon as the
// previous reply arrived, so throughput and latency are coupled like in memcaslap.
type memcacheWorker struct {
	hist               latencyHist
	gets, sets, misses int64
}

func (w *memcacheWorker) run(mc *memcacheConn, end time.Time, keys int, getRatio float64, value []byte, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for {
		t0 := time.Now()
		if !t0.Before(end) {
			return nil
		}
		key := memcacheKey(rng.IntN(keys))
		if rng.Float64() < getRatio {
			hit, err := mc.get(key)
			if err != nil {
				return err
			}
			w.gets++
			if !hit {
				w.misses++
			}
		} else {
			if err := mc.set(key, value); err != nil {
				return err
			}
			w.sets++
		}
		w.hist.record(time.Since(t0))
	}
}

// pinThread locks the calling goroutine to its OS thread and restricts that thread to cpus.
// The goroutine must not unlock: when it exits, Go discards the thread with its affinity.
func pinThread(cpus []int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin client thread to CPUs %v: %w", cpus, err)
	}
	return nil
}

// parseCPUList parses a taskset-style list such as "0", "0-1" or "0,2-3". Empty means none.
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad CPU list %q", s)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
