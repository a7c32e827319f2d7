package workload

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// listening reports whether a socket in namespace ns listens on port: a TCP socket in
// LISTEN state, or any UDP socket bound to the port and not connected.
//
// We read the kernel's socket tables instead of probing with a connection: an iperf3 server
// takes any accepted connection for a test client (and with -1 exits after it), and UDP has
// no handshake to probe with. /proc/thread-self is required: /proc/self/net shows the
// namespace of the thread-group leader, not of the thread that netnsutil.Do moved.
func listening(ns, proto string, port int) (bool, error) {
	var files []string
	switch proto {
	case "tcp":
		files = []string{"tcp", "tcp6"}
	case "udp":
		files = []string{"udp", "udp6"}
	default:
		return false, fmt.Errorf("unknown protocol %q", proto)
	}
	var found bool
	err := netnsutil.Do(ns, func() error {
		for _, f := range files {
			b, err := os.ReadFile("/proc/thread-self/net/" + f)
			if errors.Is(err, os.ErrNotExist) {
				continue // IPv6 disabled
			}
			if err != nil {
				return err
			}
			if tableHasListener(b, proto, port) {
				found = true
				return nil
			}
		}
		return nil
	})
	return found, err
}

// tableHasListener scans one /proc/net/{tcp,udp}[6] table.
func tableHasListener(table []byte, proto string, port int) bool {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		lp, ok := hexPort(f[1])
		if !ok || lp != port {
			continue
		}
		switch proto {
		case "tcp":
			if f[3] == "0A" { // TCP_LISTEN
				return true
			}
		case "udp":
			if rp, ok := hexPort(f[2]); ok && rp == 0 {
				return true
			}
		}
	}
	return false
}

// hexPort extracts the port of an "ADDR:PORT" field (both hex) of /proc/net tables.
func hexPort(field string) (int, bool) {
	i := strings.LastIndexByte(field, ':')
	if i < 0 {
		return 0, false
	}
	v, err := strconv.ParseUint(field[i+1:], 16, 16)
	if err != nil {
		return 0, false
	}
	return int(v), true
}

// connectTo is where a client connects: connect ("ip:port" or "[ip6]:port", a Service's
// ClusterIP:port that translates to the server) if set, else the server's own address and
// port. A Service translates within one family, so connect's is the server address's.
func connectTo(connect, serverAddr string, port int) (host, portStr string, err error) {
	if connect == "" {
		return serverAddr, strconv.Itoa(port), nil
	}
	ap, err := netip.ParseAddrPort(connect)
	if err != nil || ap.Addr().Is4In6() || ap.Addr().Zone() != "" || ap.Port() == 0 {
		return "", "", fmt.Errorf("connect address %q: want ip:port ([ip]:port for IPv6)", connect)
	}
	if sa, err := netip.ParseAddr(serverAddr); err == nil && sa.Is4() != ap.Addr().Is4() {
		return "", "", fmt.Errorf("connect address %q and server address %s are of different IP families", connect, serverAddr)
	}
	return ap.Addr().String(), strconv.Itoa(int(ap.Port())), nil
}
