package probe

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Counters are the SNMP/netstat counters of one network namespace, keyed "Group.Name" as in
// "TcpExt.TCPOFOQueue", "Udp.NoPorts" or "Udp6.InDatagrams" (nstat prints the same names without
// the dot).
type Counters map[string]int64

// Get returns one counter by "Group.Name".
func (c Counters) Get(name string) (int64, bool) {
	v, ok := c[name]
	return v, ok
}

// Names returns all counter names, sorted.
func (c Counters) Names() []string {
	n := make([]string, 0, len(c))
	for k := range c {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// DefaultCounters are the counters a run records unless told otherwise: reordering and its
// consequences (MFLOW splits flows, FALCON moves stages, both can reorder), and UDP delivery
// losses (small-packet stress).
var DefaultCounters = []string{
	"TcpExt.TCPOFOQueue",
	"TcpExt.TCPSACKReorder",
	"TcpExt.TCPRenoReorder",
	"TcpExt.TCPTSReorder",
	"TcpExt.TCPDSACKRecv",
	"Tcp.RetransSegs",
	"TcpExt.TCPLostRetransmit",
	"TcpExt.TCPSpuriousRTOs",
	"Udp.InDatagrams",
	"Udp.InErrors",
	"Udp.RcvbufErrors",
	"Udp.NoPorts",
}

// ErrNoCounter is returned when a requested counter is not in a snapshot (kernel without it,
// typo, or IPv6 disabled).
var ErrNoCounter = errors.New("probe: no such counter")

// gauges are the snmp fields that are settings or current values, not counters: they may go down.
var gauges = map[string]bool{
	"Ip.Forwarding": true, "Ip.DefaultTTL": true,
	"Tcp.RtoAlgorithm": true, "Tcp.RtoMin": true, "Tcp.RtoMax": true, "Tcp.MaxConn": true,
	"Tcp.CurrEstab": true,
}

// procNet is where the reading thread's network namespace shows its /proc/net files.
//
// /proc/net is a symlink to self/net, and /proc/self names the thread-group leader: its net/
// directory shows the *leader's* namespace, not that of the thread reading it. netnsutil.Do
// switches only the calling (locked) thread, so /proc/self/net would silently show the host's
// counters. /proc/thread-self/net shows the reading thread's namespace. (Checked on Linux 6.18 by
// TestProcSelfNetIsNotPerThread.)
const procNet = "/proc/thread-self/net"

// ReadNstat reads /proc/net/snmp, /proc/net/netstat and /proc/net/snmp6 of a network namespace
// (by name or path; "" is the caller's). snmp6 is optional: it is absent when IPv6 is disabled.
func ReadNstat(ns string) (Counters, error) {
	c := Counters{}
	err := netnsutil.Do(ns, func() error {
		for _, f := range []struct {
			name     string
			parse    func(io.Reader, Counters) error
			optional bool
		}{
			{"snmp", parseSNMPInto, false},
			{"netstat", parseSNMPInto, false},
			{"snmp6", parseSNMP6Into, true},
		} {
			b, err := os.ReadFile(procNet + "/" + f.name)
			if f.optional && errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			if err := f.parse(bytes.NewReader(b), c); err != nil {
				return fmt.Errorf("/proc/net/%s: %w", f.name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("nstat of namespace %q: %w", ns, err)
	}
	return c, nil
}

// ParseSNMP parses the /proc/net/snmp and /proc/net/netstat format: pairs of lines
// "Group: Name1 Name2 ..." and "Group: v1 v2 ...".
func ParseSNMP(r io.Reader) (Counters, error) {
	c := Counters{}
	return c, parseSNMPInto(r, c)
}

// ParseSNMP6 parses the /proc/net/snmp6 format: "Ip6InReceives  1" lines. The group is the name
// up to its first "6" (Ip6, Icmp6, Udp6, UdpLite6), so keys look like "Udp6.InDatagrams".
func ParseSNMP6(r io.Reader) (Counters, error) {
	c := Counters{}
	return c, parseSNMP6Into(r, c)
}

func parseSNMPInto(r io.Reader, c Counters) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20) // TcpExt header lines are several KiB
	for sc.Scan() {
		hdr := strings.Fields(sc.Text())
		if len(hdr) == 0 {
			continue
		}
		if !sc.Scan() {
			return fmt.Errorf("group %s: header without values", hdr[0])
		}
		val := strings.Fields(sc.Text())
		if len(val) == 0 || val[0] != hdr[0] {
			return fmt.Errorf("group %s: values line %q does not follow its header", hdr[0], sc.Text())
		}
		if len(val) != len(hdr) {
			return fmt.Errorf("group %s: %d names, %d values", hdr[0], len(hdr)-1, len(val)-1)
		}
		group := strings.TrimSuffix(hdr[0], ":")
		for i := 1; i < len(hdr); i++ {
			v, err := parseCounter(val[i])
			if err != nil {
				return fmt.Errorf("%s.%s: %w", group, hdr[i], err)
			}
			c[group+"."+hdr[i]] = v
		}
	}
	return sc.Err()
}

func parseSNMP6Into(r io.Reader, c Counters) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return fmt.Errorf("bad line %q", sc.Text())
		}
		i := strings.IndexByte(f[0], '6')
		if i <= 0 || i == len(f[0])-1 {
			return fmt.Errorf("counter %q has no Group6 prefix", f[0])
		}
		v, err := parseCounter(f[1])
		if err != nil {
			return fmt.Errorf("%s: %w", f[0], err)
		}
		c[f[0][:i+1]+"."+f[0][i+1:]] = v
	}
	return sc.Err()
}

// parseCounter accepts the kernel's %lu counters and the few signed fields (Tcp.MaxConn is -1).
func parseCounter(s string) (int64, error) {
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return v, nil
	}
	u, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, err
	}
	// Above 2^63 a 64-bit counter would need centuries at line rate: treat it as garbage.
	return 0, fmt.Errorf("value %d does not fit in int64", u)
}

// CounterDeltas returns cur - prev for the named counters (all counters of cur when names is
// nil). A name missing from either snapshot returns ErrNoCounter. A counter going backwards
// returns ErrCounterReset (the namespace was recreated, or stats were reset); gauges such as
// Tcp.CurrEstab are allowed to go down and give a negative delta.
func CounterDeltas(prev, cur Counters, names []string) (map[string]int64, error) {
	if names == nil {
		names = cur.Names()
	}
	d := make(map[string]int64, len(names))
	for _, n := range names {
		c, ok1 := cur[n]
		p, ok2 := prev[n]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: %s", ErrNoCounter, n)
		}
		if c < p && !gauges[n] {
			return nil, fmt.Errorf("%s: %w: %d -> %d", n, ErrCounterReset, p, c)
		}
		d[n] = c - p
	}
	return d, nil
}
