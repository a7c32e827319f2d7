package ezpath

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// torLab builds a docker-style --tor lab (2 hosts x 2 containers) and attaches ezpath to both
// hosts with the given options; cleanup detaches, removes the lab and proves nothing is left.
func torLab(t *testing.T, name string, extra map[string]string) *lab.Lab {
	t.Helper()
	return torLabSpec(t, lab.Spec{Name: name, Style: lab.StyleDocker, Containers: 2, ToR: true}, extra)
}

// torLabSpec is torLab for any docker-style --tor spec.
func torLabSpec(t *testing.T, spec lab.Spec, extra map[string]string) *lab.Lab {
	t.Helper()
	name := spec.Name
	t.Cleanup(func() { // last: after the lab is down
		if _, err := os.Stat(ledgerPath(name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("ledger %s left behind", ledgerPath(name))
		}
	})
	l := labtest.Up(t, spec) // its cleanup: lab down, then nothing left with the lab's prefix
	t.Cleanup(func() {       // first: detach while the lab is up
		for _, h := range []string{"h1", "h2"} {
			if st, _ := datapath.LoadState(lab.NsPrefix(name)+h, Name); st != nil {
				_, _ = datapath.Detach(context.Background(), lab.NsPrefix(name)+h, "")
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := map[string]string{OptLab: name}
	for k, v := range extra {
		opts[k] = v
	}
	for _, h := range l.Hosts {
		if _, err := datapath.Attach(ctx, h.Netns, Name, datapath.Options{Extra: opts}); err != nil {
			t.Fatalf("attach %s: %v", h.Netns, err)
		}
	}
	return l
}

// capture runs tcpdump on dev in ns while traffic runs, and returns what it printed.
func capture(t *testing.T, ns, dev string, traffic func()) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "tcpdump", "-l", "-c", "4", "-eni", dev, "icmp or (udp port 4789)")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	time.Sleep(700 * time.Millisecond) // tcpdump attaches
	traffic()
	_ = cmd.Wait()
	return out.String()
}

func ping(t *testing.T, l *lab.Lab, from, to string) {
	t.Helper()
	src, _ := l.Node(from)
	dst, _ := l.Node(to)
	if out, err := netnsutil.Run(context.Background(), src.Netns, "ping", "-c", "3", "-i", "0.2", "-w", "5", dst.AddrOnly()); err != nil {
		t.Fatalf("ping %s -> %s: %v\n%s", from, to, err, out)
	}
}

func stats(t *testing.T, l *lab.Lab, i int) (host, tor map[string]uint64) {
	t.Helper()
	r, err := openRack(l.Spec.Name)
	must(t, err)
	ht, err := openHostTables(r.hostDir(i))
	must(t, err)
	defer ht.Close()
	tt, err := openTorTables(r.torDir(i))
	must(t, err)
	defer tt.Close()
	host, err = hostStats(ht)
	must(t, err)
	tor, err = torStats(tt)
	must(t, err)
	return host, tor
}

func TestOffloadedPairIsTaggedToTheSwitchAndTunnelledBetweenSwitches(t *testing.T) {
	l := torLab(t, "ezoff", map[string]string{OptPolicy: "manual"})
	must(t, Offload("ezoff", "h1-c1", "198.19.2.2", "manual"))
	onLink := capture(t, "prg-ezoff-tor1", lab.ToRDown, func() { ping(t, l, "h1-c1", "h2-c1") })
	if !strings.Contains(onLink, "vlan 100") || !strings.Contains(onLink, "198.19.1.2 > 198.19.2.2: ICMP echo request") {
		t.Fatalf("host-ToR link should carry the container's frame tagged with VID 100:\n%s", onLink)
	}
	between := capture(t, "prg-ezoff-tor2", lab.ToRUp, func() { ping(t, l, "h1-c1", "h2-c1") })
	if !strings.Contains(between, "198.18.0.254.") || !strings.Contains(between, "> 198.18.0.253.4789: VXLAN") || !strings.Contains(between, "vni 4096") {
		t.Fatalf("ToR-ToR link should carry VXLAN between the switches' VTEPs:\n%s", between)
	}
	// The other pair stays on the overlay: host VTEP to host VTEP, routed by the switches.
	overlay := capture(t, "prg-ezoff-tor2", lab.ToRUp, func() { ping(t, l, "h1-c2", "h2-c2") })
	if !strings.Contains(overlay, "198.18.0.1.") || !strings.Contains(overlay, "> 198.18.0.2.4789: VXLAN") {
		t.Fatalf("an un-offloaded pair should cross the switches as host-VTEP VXLAN:\n%s", overlay)
	}
	if err := lab.Verify(context.Background(), l); err != nil {
		t.Fatalf("every pair, offloaded or not, must still reach each other over TCP and UDP: %v", err)
	}
	for i := 1; i <= 2; i++ {
		hs, ts := stats(t, l, i)
		if hs["tagged"] == 0 || hs["delivered"] == 0 || ts["encap"] == 0 || ts["decap"] == 0 || ts["transit"] == 0 {
			t.Fatalf("h%d counters: host %v tor %v", i, hs, ts)
		}
		if hs["miss_pod"]+hs["miss_vid"]+hs["errors"]+ts["miss_encap"]+ts["miss_decap"]+ts["errors"] != 0 {
			t.Fatalf("h%d dropped frames: host %v tor %v", i, hs, ts)
		}
	}
	time.Sleep(time.Second + 300*time.Millisecond) // the controller's next poll sees all of it
	views, err := Flows("ezoff", 300*time.Millisecond)
	must(t, err)
	var sawOff, sawOverlay bool
	for _, v := range views {
		sawOff = sawOff || (v.State == "offloaded" && v.Src == "h1-c1")
		sawOverlay = sawOverlay || (v.State == "overlay" && v.Src == "h1-c2")
	}
	if !sawOff || !sawOverlay {
		b, _ := json.MarshalIndent(views, "", " ")
		t.Fatalf("flows should show the offloaded and the overlay pair:\n%s", b)
	}
	// Un-offload: back to host-VTEP VXLAN, and the switch tables are empty again.
	must(t, Unoffload("ezoff", "h1-c1", "h2-c1", 50*time.Millisecond))
	back := capture(t, "prg-ezoff-tor2", lab.ToRUp, func() { ping(t, l, "h1-c1", "h2-c1") })
	if !strings.Contains(back, "198.18.0.1.") {
		t.Fatalf("after un-offload the pair should be on the overlay again:\n%s", back)
	}
	r, _ := openRack("ezoff")
	for i := 1; i <= 2; i++ {
		tt, err := openTorTables(r.torDir(i))
		must(t, err)
		if n := countEntries(tt.EzpEncap) + countEntries(tt.EzpDecap); n != 0 {
			t.Fatalf("tor%d still holds %d tunnel entries after un-offload", i, n)
		}
		tt.Close()
	}
}

func TestFullSwitchTableLeavesThePairOnTheOverlay(t *testing.T) {
	l := torLab(t, "ezfull", map[string]string{OptPolicy: "manual", OptTableSize: "1"})
	must(t, Offload("ezfull", "h1-c1", "h2-c1", "manual"))
	err := Offload("ezfull", "h1-c2", "h2-c2", "manual")
	if !errors.Is(err, ErrTableFull) {
		t.Fatalf("a second pair in 1-entry tables should be refused as table full, got %v", err)
	}
	led, err := ReadLedger("ezfull")
	must(t, err)
	if len(led.Pairs) != 1 || len(led.Refused) != 1 || !strings.Contains(led.Refused[0].Note, "stays on the overlay") {
		t.Fatalf("ledger should hold one pair and one refusal: %+v", led)
	}
	// Nothing of the refused pair was half-installed: it still works, over the overlay.
	overlay := capture(t, "prg-ezfull-tor2", lab.ToRUp, func() { ping(t, l, "h1-c2", "h2-c2") })
	if !strings.Contains(overlay, "198.18.0.1.") {
		t.Fatalf("the refused pair should use the overlay:\n%s", overlay)
	}
	ping(t, l, "h1-c1", "h2-c1")
}

// tcpRetrans reads the TCP retransmitted-segment counter of a namespace.
func tcpRetrans(t *testing.T, ns string) uint64 {
	t.Helper()
	s, err := netnsutil.Run(context.Background(), ns, "cat", "/proc/net/snmp")
	must(t, err)
	var keys, vals []string
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "Tcp:") {
			if keys == nil {
				keys = strings.Fields(line)
			} else {
				vals = strings.Fields(line)
			}
		}
	}
	for i, k := range keys {
		if k == "RetransSegs" && i < len(vals) {
			var n uint64
			_, _ = fmtSscan(vals[i], &n)
			return n
		}
	}
	t.Fatal("no RetransSegs in /proc/net/snmp")
	return 0
}

func TestToggleDuringATransferKeepsTheConnection(t *testing.T) {
	l := torLab(t, "eztgl", map[string]string{OptPolicy: "manual"})
	srv, _ := l.Node("h2-c1")
	cli, _ := l.Node("h1-c1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := netnsutil.Command(ctx, srv.Netns, "iperf3", "-s", "-1", "-p", "5299")
	must(t, s.Start())
	defer func() { _ = s.Process.Kill(); _ = s.Wait() }()
	time.Sleep(300 * time.Millisecond)
	before := tcpRetrans(t, cli.Netns)
	c := netnsutil.Command(ctx, cli.Netns, "iperf3", "-c", srv.AddrOnly(), "-p", "5299", "-t", "4", "-b", "300M", "-J")
	var out strings.Builder
	c.Stdout = &out
	must(t, c.Start())
	time.Sleep(400 * time.Millisecond)
	for i := 0; i < 6; i++ { // 3 on, 3 off
		if i%2 == 0 {
			must(t, Offload("eztgl", "h1-c1", "h2-c1", "manual"))
		} else {
			must(t, Unoffload("eztgl", "h1-c1", "h2-c1", DefaultDrain))
		}
		time.Sleep(400 * time.Millisecond)
	}
	if err := c.Wait(); err != nil {
		t.Fatalf("iperf3 failed across 6 offload toggles (connection reset?): %v\n%s", err, out.String())
	}
	var res struct {
		End struct {
			SumReceived struct{ Bytes uint64 }    `json:"sum_received"`
			SumSent     struct{ Retransmits int } `json:"sum_sent"`
		} `json:"end"`
		Error string `json:"error"`
	}
	must(t, json.Unmarshal([]byte(out.String()), &res))
	if res.Error != "" || res.End.SumReceived.Bytes == 0 {
		t.Fatalf("transfer did not complete: %q, %d bytes", res.Error, res.End.SumReceived.Bytes)
	}
	hs, _ := stats(t, l, 1)
	if hs["tagged"] == 0 {
		t.Fatal("no frame took the switch path during the on phases")
	}
	t.Logf("6 toggles in one 4 s TCP transfer: %d bytes, %d retransmits (iperf3), %d retransmitted segments (nstat)",
		res.End.SumReceived.Bytes, res.End.SumSent.Retransmits, tcpRetrans(t, cli.Netns)-before)
}

func TestControllerOffloadsAHotPairAndReturnsItWhenIdle(t *testing.T) {
	l := torLab(t, "ezauto", map[string]string{OptPolicy: "auto", OptInterval: "200ms", OptActive: "2", OptIdle: "3", OptMinRate: "100000"})
	srv, _ := l.Node("h2-c2")
	cli, _ := l.Node("h1-c2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := netnsutil.Command(ctx, srv.Netns, "iperf3", "-s", "-1", "-p", "5298")
	must(t, s.Start())
	defer func() { _ = s.Process.Kill(); _ = s.Wait() }()
	time.Sleep(300 * time.Millisecond)
	out, err := netnsutil.Run(ctx, cli.Netns, "iperf3", "-c", srv.AddrOnly(), "-p", "5298", "-t", "3", "-b", "100M")
	if err != nil {
		t.Fatalf("iperf3: %v\n%s", err, out)
	}
	offloaded := func() bool {
		led, err := ReadLedger("ezauto")
		must(t, err)
		for _, p := range led.Pairs {
			if p.same("h1-c2", "h2-c2") && p.By == "auto" {
				return true
			}
		}
		return false
	}
	hs, _ := stats(t, l, 1)
	if hs["tagged"] == 0 {
		t.Fatalf("the controller should have moved the hot pair to the switch path during the transfer (host counters %v)", hs)
	}
	deadline := time.Now().Add(5 * time.Second)
	for offloaded() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if offloaded() {
		t.Fatal("an idle auto-offloaded pair should go back to the overlay after 3 idle intervals")
	}
}

func TestDetachLeavesNothing(t *testing.T) {
	l := torLab(t, "ezdet", map[string]string{OptPolicy: "manual"})
	must(t, Offload("ezdet", "h1-c1", "h2-c1", "manual"))
	for _, h := range l.Hosts {
		if _, err := datapath.Detach(context.Background(), h.Netns, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"prg-ezdet-h1", "prg-ezdet-h1-ov", "prg-ezdet-h2"} {
		if out, _ := netnsutil.Run(context.Background(), ns, "ip", "-br", "link"); strings.Contains(out, RelayDev) {
			t.Fatalf("%s still has the relay %s:\n%s", ns, RelayDev, out)
		}
	}
	for _, n := range []lab.Node{l.Hosts[0], l.ToRs[0], l.ToRs[1]} {
		for _, d := range n.Devices {
			idx, err := ifindexIn(n.Netns, d.Name)
			must(t, err)
			if progs := bpfobj.ProgramsOn(n.Netns, idx, false, "prg_ezp"); len(progs) > 0 {
				t.Fatalf("%s/%s still runs %v", n.Netns, d.Name, progs)
			}
		}
	}
	if _, err := os.Stat(ledgerPath("ezdet")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("ledger left after the last host detached")
	}
	if _, err := os.Stat(datapath.PinDir("prg-ezdet-h1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("pins left after detach")
	}
	if err := lab.Verify(context.Background(), l); err != nil {
		t.Fatalf("the overlay must work as before: %v", err)
	}
}
