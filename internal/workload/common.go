// Package workload drives the field's real benchmark tools (iperf3, sockperf, memcached,
// nginx + wrk) inside network namespaces and parses their results into JSON-ready structs.
//
// Every Run starts a server in one namespace, waits until its socket is listening (read from
// the namespace's own /proc/net tables, so no probe connection disturbs tools like iperf3
// that treat any connection as a test), runs a client under a bounded deadline, parses its
// output and always stops and reaps the server, also on error or context cancellation.
package workload

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// clientMargin is added to a client's nominal duration before we call it stalled: tools
// spend time connecting, warming up and exchanging results after the measured interval.
const clientMargin = 10 * time.Second

// readyTimeout bounds how long a server may take to open its listening socket.
const readyTimeout = 5 * time.Second

// stderrLines is how many trailing stderr lines an error carries.
const stderrLines = 8

// debPackage names the Debian package that provides each binary we run.
var debPackage = map[string]string{
	"iperf3":    "iperf3",
	"sockperf":  "sockperf",
	"memcached": "memcached",
	"memcslap":  "libmemcached-tools",
	"memcaslap": "libmemcached-tools",
	"nginx":     "nginx-light",
	"wrk":       "wrk",
	"taskset":   "util-linux",
	"chrt":      "util-linux",
	"ip":        "iproute2",
}

// Require checks that the given binaries are on PATH. The error lists every missing one
// together with the package that provides it, so the fix is one command.
func Require(tools ...string) error {
	var errs []error
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			pkg := debPackage[t]
			if pkg == "" {
				pkg = t
			}
			errs = append(errs, fmt.Errorf("%s not found: run scripts/setup.sh or apt-get install %s", t, pkg))
		}
	}
	return errors.Join(errs...)
}

// prepare starts every Run: it fills in the config's defaults and validates it (defaults), then
// fails early, with a clear message, on a namespace that does not exist; otherwise
// `ip netns exec` would fail later with a less obvious error.
func prepare(defaults func() error, names ...string) error {
	if err := defaults(); err != nil {
		return err
	}
	for _, n := range names {
		if !netnsutil.Exists(n) {
			return fmt.Errorf("network namespace %q does not exist (see `ip netns list`)", n)
		}
	}
	return nil
}

// lastLines returns the last n non-empty lines of s, joined by " | " so they fit in one error.
func lastLines(s string, n int) string {
	s = stripANSI(s)
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// stripANSI removes terminal colour escapes (sockperf prints them even into pipes).
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b[") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j // skip the final byte too
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// toolError builds the error every workload returns for a failed or stalled tool: it names
// the tool, the namespace, what went wrong and the tail of the tool's diagnostics.
func toolError(tool, ns string, err error, stderr, stdout string) error {
	// Tools with JSON output (iperf3 -J) put their reason there, not on stderr.
	if msg := jsonErrorField(stdout); msg != "" && !strings.Contains(err.Error(), msg) {
		err = fmt.Errorf("%w (%s says: %s)", err, tool, msg)
		stdout = ""
	}
	tail := lastLines(stderr, stderrLines)
	src := "stderr"
	if tail == "" && !strings.HasPrefix(strings.TrimSpace(stdout), "{") {
		// Some tools (sockperf) report errors on stdout and exit 0.
		tail, src = lastLines(stdout, stderrLines), "stdout"
	}
	if tail == "" {
		return fmt.Errorf("%s (%s): %w (stderr empty)", tool, netnsutil.Label(ns), err)
	}
	return fmt.Errorf("%s (%s): %w; last %s: %s", tool, netnsutil.Label(ns), err, src, tail)
}

// jsonErrorField returns the top-level "error" string of a JSON document, or "".
func jsonErrorField(s string) string {
	if !strings.HasPrefix(strings.TrimSpace(s), "{") {
		return ""
	}
	var doc struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(s), &doc) != nil {
		return ""
	}
	return doc.Error
}

// percentiles maps a percentile (99.9 for p99.9) to the result field that holds its latency.
type percentiles map[float64]*float64

// set stores v in the field for the percentile a tool printed as label ("99", "99.000", "99.900");
// it returns the percentile, or false when label is not a number or not one the result keeps.
func (p percentiles) set(label string, v float64) (float64, bool) {
	pct, err := strconv.ParseFloat(label, 64)
	if err != nil {
		return 0, false
	}
	f, ok := p[pct]
	if ok {
		*f = v
	}
	return pct, ok
}

// secondsCeil turns a duration into whole seconds for tools that only take integers,
// rounding up and never below one second.
func secondsCeil(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}
