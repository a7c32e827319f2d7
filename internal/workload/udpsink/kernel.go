package udpsink

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// udpCounters are the namespace-wide UDP MIB counters we diff over a run. They include every
// UDP socket of the namespace (the VXLAN device's own socket too), so they bound the sink's
// drops from above; socketDrops below is this socket alone.
type udpCounters struct {
	InErrors     uint64
	RcvbufErrors uint64
	MemErrors    uint64
}

// readUDPCounters reads /proc/thread-self/net/snmp inside netns. thread-self matters: /proc/self
// follows the thread group leader's namespace, not the one this locked thread has entered.
func readUDPCounters(netns string) (udpCounters, error) {
	var c udpCounters
	err := netnsutil.Do(netns, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		v, err := parseSNMP(b, "Udp")
		if err != nil {
			return err
		}
		c = udpCounters{InErrors: v["InErrors"], RcvbufErrors: v["RcvbufErrors"], MemErrors: v["MemErrors"]}
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("read UDP counters in namespace %q: %w", netns, err)
	}
	return c, nil
}

// parseSNMP returns the counters of one protocol from /proc/net/snmp: a header line of names
// followed by a line of values, both prefixed with "Proto:".
func parseSNMP(b []byte, proto string) (map[string]uint64, error) {
	prefix := proto + ":"
	sc := bufio.NewScanner(bytes.NewReader(b))
	var names []string
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(line, prefix))
		if names == nil {
			names = fields
			continue
		}
		if len(fields) != len(names) {
			return nil, fmt.Errorf("snmp %s: %d names but %d values", proto, len(names), len(fields))
		}
		out := make(map[string]uint64, len(names))
		for i, n := range names {
			v, err := strconv.ParseInt(fields[i], 10, 64) // some counters (MaxConn) are signed
			if err != nil {
				return nil, fmt.Errorf("snmp %s %s=%q: %w", proto, n, fields[i], err)
			}
			out[n] = uint64(v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("snmp: no %s lines", proto)
}

// socketDrops returns the socket's own drop counter (sk_drops: receive buffer full, memory
// accounting failures, filter drops), via SO_MEMINFO. Unlike SO_RXQ_OVFL it is readable at any
// time, including drops after the last datagram that got through.
func socketDrops(fd int) (uint64, error) {
	var mi [unix.SK_MEMINFO_VARS]uint32
	if err := getsockoptRaw(fd, unix.SOL_SOCKET, unix.SO_MEMINFO, mi[:]); err != nil {
		return 0, fmt.Errorf("SO_MEMINFO: %w", err)
	}
	return uint64(mi[unix.SK_MEMINFO_DROPS]), nil
}
