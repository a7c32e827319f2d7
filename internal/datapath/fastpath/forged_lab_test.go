package fastpath

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// TestForgedSourceLab: pod X sends, from its own veth, TCP segments with pod V's source address
// and the 5-tuple of V's running stream to a pod of the other node (a bad TCP checksum: the far
// end drops them, so only the fast path could be disturbed) while V streams; V's stream stays
// at least 99 % on the fast path and the forgeries are counted "forged". Before src_refused each
// forged segment moved V's flow to X's veth and un-learned it (V's next packet missed).
func TestForgedSourceLab(t *testing.T) {
	l := labForTest(t, lab.Spec{Name: "fpfg", Style: lab.StyleFlannel, Containers: 2})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	v, x, r := l.Containers[0], l.Containers[1], l.Containers[2]
	vAddr := netip.MustParseAddr(strings.Split(v.Addr, "/")[0])
	rAddr := netip.MustParseAddr(strings.Split(r.Addr, "/")[0])
	attachAll(t, hosts)

	// X's gateway (cni0) MAC, as X's own routed frames carry it.
	run(t, x.Netns, "ping", "-c", "1", "-w", "3", rAddr.String())
	gw := neighMAC(t, x.Netns)

	run(t, r.Netns, "iperf3", "-s", "-D", "-1", "-p", "5311")
	waitListening(t, r.Netns, 5311)
	done := make(chan error, 1)
	go func() {
		_, err := netnsutil.Run(context.Background(), v.Netns, "iperf3", "-c", rAddr.String(), "-p", "5311", "-t", "5")
		done <- err
	}()
	var ports []uint16
	labtest.Eventually(t, 3*time.Second, "V's connections", func() (bool, string) {
		o, err := netnsutil.Run(context.Background(), v.Netns, "ss", "-Htn", "state", "established", "dport = :5311")
		ports = ports[:0]
		for _, line := range strings.Split(strings.TrimSpace(o), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 {
				continue
			}
			if i := strings.LastIndex(f[2], ":"); i >= 0 {
				if p, err := strconv.Atoi(f[2][i+1:]); err == nil {
					ports = append(ports, uint16(p))
				}
			}
		}
		return err == nil && len(ports) >= 2, o
	})
	time.Sleep(time.Second) // learned both ways

	fd, xMAC := rawSocket(t, x.Netns)
	defer unix.Close(fd)
	eg0, _ := counters(t, hosts[0])
	stop := time.Now().Add(3 * time.Second)
	sent := 0
	for time.Now().Before(stop) {
		for _, p := range ports {
			f := frame{dst: gw, src: xMAC, saddr: vAddr, daddr: rAddr, proto: 6, sport: p, dport: 5311, tcpFlags: 0x10,
				payload: []byte("forged")}
			b := f.bytes()
			b[50] ^= 0xff // TCP checksum: the far end drops it
			if err := unix.Send(fd, b, 0); err == nil {
				sent++
			}
		}
		time.Sleep(500 * time.Microsecond)
	}
	eg1, _ := counters(t, hosts[0])
	if err := <-done; err != nil {
		t.Fatalf("V's stream: %v", err)
	}
	// V's packets: all but the forgeries. Counted "forged" now; before the fix each was "stale"
	// (it moved V's flow) or, on a flow the learner had re-learned from a forgery, a hit on X's
	// veth, and V's next packet "miss" or "stale" (the flow moved back).
	forged := eg1["forged"] - eg0["forged"]
	hit := eg1["hit"] - eg0["hit"]
	var all uint64
	for k, n := range eg1 {
		if k != "learned" && k != "other" && k != "local" && k != "forged" {
			all += n - eg0[k]
		}
	}
	all -= min(all, uint64(sent)-min(uint64(sent), forged)) // the forgeries not counted "forged"
	share := float64(hit) / float64(max(all, 1))
	t.Logf("%d forged segments sent, %d counted forged; V's stream: %.2f%% of %d egress packets fast", sent, forged, 100*share, all)
	if share < 0.99 || all == 0 {
		t.Fatalf("V's stream under forgery: %.2f%% fast (want >= 99%%)\nbefore %v\nafter %v", 100*share, eg0, eg1)
	}
	if forged < uint64(sent)*9/10 {
		t.Fatalf("forgeries counted: %d of %d sent", forged, sent)
	}
}

// neighMAC is the MAC of the one neighbour of namespace ns's eth0 (its gateway).
func neighMAC(t *testing.T, ns string) net.HardwareAddr {
	t.Helper()
	o := run(t, ns, "ip", "neigh", "show", "dev", "eth0")
	for _, f := range strings.Fields(o) {
		if m, err := net.ParseMAC(f); err == nil && len(m) == 6 {
			return m
		}
	}
	t.Fatalf("no neighbour on %s's eth0: %q", ns, o)
	return nil
}

// rawSocket is a packet socket on namespace ns's eth0 (frames sent as they are), and its MAC.
func rawSocket(t *testing.T, ns string) (int, net.HardwareAddr) {
	t.Helper()
	fd := -1
	var mac net.HardwareAddr
	err := netnsutil.Do(ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		if err := unix.Bind(s, &unix.SockaddrLinklayer{Protocol: 0, Ifindex: ifi.Index}); err != nil {
			unix.Close(s)
			return err
		}
		fd, mac = s, ifi.HardwareAddr
		return nil
	})
	if err != nil {
		t.Fatalf("raw socket in %s: %v", ns, err)
	}
	return fd, mac
}
