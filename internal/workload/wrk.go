package workload

import (
	"bufio"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// WrkResult is what `wrk --latency` reports (plus the nginx settings it ran against).
type WrkResult struct {
	FileSize            int     `json:"file_size"`
	Close               bool    `json:"close,omitempty"` // one connection per request (Connection: close)
	Workers             int     `json:"workers"`
	Threads             int     `json:"threads"`
	Connections         int     `json:"connections"`
	Requests            int64   `json:"requests"`
	DurationS           float64 `json:"duration_s"`
	ReadBytes           float64 `json:"read_bytes"` // wrk rounds to 2 decimals of its unit
	RequestsPerSec      float64 `json:"requests_per_sec"`
	TransferBytesPerSec float64 `json:"transfer_bytes_per_sec"`
	LatencyAvgUs        float64 `json:"latency_avg_us"`
	LatencyStdevUs      float64 `json:"latency_stdev_us"`
	LatencyMaxUs        float64 `json:"latency_max_us"`
	P50Us               float64 `json:"p50_us"`
	P75Us               float64 `json:"p75_us"`
	P90Us               float64 `json:"p90_us"`
	P99Us               float64 `json:"p99_us"`
	ErrorsConnect       int64   `json:"errors_connect"`
	ErrorsRead          int64   `json:"errors_read"`
	ErrorsWrite         int64   `json:"errors_write"`
	ErrorsTimeout       int64   `json:"errors_timeout"`
	Non2xx3xx           int64   `json:"non_2xx_3xx"`
}

var (
	wrkHeader  = regexp.MustCompile(`^(\d+) threads and (\d+) connections`)
	wrkLatency = regexp.MustCompile(`^Latency\s+(\S+)\s+(\S+)\s+(\S+)\s+`)
	wrkPct     = regexp.MustCompile(`^(50|75|90|99)%\s+(\S+)$`)
	wrkTotal   = regexp.MustCompile(`^(\d+) requests in (\S+), (\S+) read`)
	wrkSockErr = regexp.MustCompile(`^Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkNon2xx  = regexp.MustCompile(`^Non-2xx or 3xx responses: (\d+)`)
	wrkRPS     = regexp.MustCompile(`^Requests/sec:\s+(\S+)`)
	wrkXfer    = regexp.MustCompile(`^Transfer/sec:\s+(\S+)`)
)

// ParseWrk parses wrk 4.x's default report printed with --latency.
func ParseWrk(out string) (WrkResult, error) {
	var r WrkResult
	var have struct{ rps, p50, total bool }
	pcts := percentiles{50: &r.P50Us, 75: &r.P75Us, 90: &r.P90Us, 99: &r.P99Us}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		var err error
		switch {
		case wrkHeader.MatchString(l):
			m := wrkHeader.FindStringSubmatch(l)
			r.Threads, r.Connections = int(atoi(m[1])), int(atoi(m[2]))
		case wrkLatency.MatchString(l):
			m := wrkLatency.FindStringSubmatch(l)
			r.LatencyAvgUs, err = wrkTimeUs(m[1])
			if err == nil {
				r.LatencyStdevUs, err = wrkTimeUs(m[2])
			}
			if err == nil {
				r.LatencyMaxUs, err = wrkTimeUs(m[3])
			}
		case wrkPct.MatchString(l):
			m := wrkPct.FindStringSubmatch(l)
			var v float64
			if v, err = wrkTimeUs(m[2]); err == nil {
				if p, ok := pcts.set(m[1], v); ok && p == 50 {
					have.p50 = true
				}
			}
		case wrkTotal.MatchString(l):
			m := wrkTotal.FindStringSubmatch(l)
			r.Requests, have.total = atoi(m[1]), true
			var us float64
			us, err = wrkTimeUs(m[2])
			r.DurationS = us / 1e6
			if err == nil {
				r.ReadBytes, err = wrkBytes(m[3])
			}
		case wrkSockErr.MatchString(l):
			m := wrkSockErr.FindStringSubmatch(l)
			r.ErrorsConnect, r.ErrorsRead, r.ErrorsWrite, r.ErrorsTimeout = atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4])
		case wrkNon2xx.MatchString(l):
			r.Non2xx3xx = atoi(wrkNon2xx.FindStringSubmatch(l)[1])
		case wrkRPS.MatchString(l):
			r.RequestsPerSec, err = strconv.ParseFloat(wrkRPS.FindStringSubmatch(l)[1], 64)
			have.rps = true
		case wrkXfer.MatchString(l):
			r.TransferBytesPerSec, err = wrkBytes(wrkXfer.FindStringSubmatch(l)[1])
		}
		if err != nil {
			return r, fmt.Errorf("wrk output line %q: %w", l, err)
		}
	}
	if !have.rps || !have.p50 || !have.total {
		return r, errors.New("no wrk report (Requests/sec, latency distribution, totals) in output")
	}
	return r, nil
}

// check turns a report that parsed but measured nothing useful into an error: wrk exits 0
// when every request failed.
func (r WrkResult) check() error {
	switch {
	case r.Requests == 0:
		return errors.New("no request completed")
	case r.Non2xx3xx >= r.Requests:
		return fmt.Errorf("all %d responses were errors (non-2xx/3xx)", r.Requests)
	}
	return nil
}

// unit is a suffix wrk prints after a number and what one of it is worth in the unit we store.
type unit struct {
	suffix string
	mult   float64
}

// The first suffix s ends in wins, so a suffix comes before the shorter ones it ends in ("ms"
// before "s", "MB" before "B"). Sizes are binary: 1 KB = 1024 B.
var (
	wrkTimeUnits = []unit{{"us", 1}, {"ms", 1e3}, {"s", 1e6}, {"m", 60e6}, {"h", 3600e6}}
	wrkSizeUnits = []unit{{"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"TB", 1 << 40}, {"PB", 1 << 50}, {"B", 1}}
)

// scaled parses s as a number followed by the first suffix of units that s ends in; found is
// false when s ends in none of them.
func scaled(s string, units []unit) (v float64, found bool, err error) {
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(num, 64)
			return f * u.mult, true, err
		}
	}
	return 0, false, nil
}

// wrkTimeUs converts wrk's time strings ("211.00us", "1.23ms", "1.10s", "2.00m") to µs.
func wrkTimeUs(s string) (float64, error) {
	v, found, err := scaled(s, wrkTimeUnits)
	if !found || err != nil {
		return 0, fmt.Errorf("bad time %q", s)
	}
	return v, nil
}

// wrkBytes converts wrk's binary-unit sizes ("48.79MB", "512.00B") to bytes.
func wrkBytes(s string) (float64, error) {
	v, found, err := scaled(s, wrkSizeUnits)
	if !found {
		// Small values carry no unit at all in some wrk builds.
		v, err = strconv.ParseFloat(s, 64)
	}
	if err != nil {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v, nil
}
