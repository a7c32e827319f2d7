package fastpath

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// TestLabUpgradeFromBeforeU6: an attachment made by a binary that predates the IPv6 underlay
// (bpf/fastpath_u6.h; e.g. fe2a938) on real flannel's dual-stack layout (flannel-v6.1 beside
// flannel.1) is upgraded in place: every link runs an "older" program, its pins lack
// prg_fastpath_u6cfg/vtep6/u6dev and its record notes that flannel-v6.1 takes the normal path.
// After Upgrade the IPv6 underlay's config is written (host 1's IPv6 VTEP, flannel-v6.1's
// ifindex), the note is attach's, and an IPv6 stream between pods of the two nodes takes the fast
// path as after a fresh attach (>= 99 % of node A's sent segments). Before the fix the upgrade
// created those maps empty and nothing wrote them while the pod count stayed: the pods' IPv6
// stayed on the normal path until the next detach and attach (scripts/upgrade-check.sh found it).
func TestLabUpgradeFromBeforeU6(t *testing.T) {
	l := labForTest(t, lab.Spec{Name: "fpupg6", Style: lab.StyleFlannel, Containers: 1, IPv6: true, IPv6Underlay: true})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	attachAll(t, hosts)
	h := hosts[0]
	dir := datapath.ModePinDir(h, Name)
	dev6 := l.Spec.FlannelV6()

	// As the older binary left it.
	replaced := installOlderPrograms(t, h)
	for _, m := range []string{"prg_fastpath_u6cfg", "prg_fastpath_vtep6", "prg_fastpath_u6dev"} {
		if err := os.Remove(filepath.Join(dir, m)); err != nil {
			t.Fatal(err)
		}
	}
	err := datapath.UpdateState(h, Name, time.Second, func(st *datapath.State) error {
		ms, err := datapath.LoadModeState[modeState](st)
		if err != nil {
			return err
		}
		ov := ms.overlays()[0]
		var notes []string
		for _, n := range ms.Notes {
			if !strings.Contains(n, "the IPv6 underlay beside") {
				notes = append(notes, n)
			}
		}
		ms.Notes = append(notes, h+"/"+dev6+": only one routed VXLAN overlay per namespace gets the fast path ("+
			ov.VX.Dev.String()+" does); its traffic takes the normal path")
		datapath.SetModeState(st, ms)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	st, err := datapath.LoadState(h, Name)
	if err != nil || st == nil {
		t.Fatalf("record: %v", err)
	}
	links, err := mode{}.Upgrade(context.Background(), st)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if len(links) != replaced {
		t.Fatalf("upgrade replaced %v, want the %d links that ran an older program", links, replaced)
	}
	p, err := openPinned(h, 0)
	if err != nil {
		t.Fatalf("after the upgrade: %v", err)
	}
	var c fpFpU6cfg
	var d fpFpU6dev
	if err := p.PrgFastpathU6cfg.Lookup(uint32(0), &c); err != nil {
		t.Fatal(err)
	}
	if err := p.PrgFastpathU6dev.Lookup(uint32(0), &d); err != nil {
		t.Fatal(err)
	}
	p.Close()
	var a [16]byte
	for i := range 4 {
		binary.LittleEndian.PutUint32(a[4*i:], c.Vtep[i])
	}
	want := l.Spec.HostAddr6(1).Addr()
	ifindex := strings.Fields(run(t, h, "cat", "/sys/class/net/"+dev6+"/ifindex"))
	if got := netip.AddrFrom16(a); got != want || len(ifindex) != 1 || strconv.Itoa(int(d.Ifindex)) != ifindex[0] {
		t.Fatalf("after the upgrade the IPv6 underlay's config is vtep %s, device %d; want %s, %s's ifindex %v",
			got, d.Ifindex, want, dev6, ifindex)
	}
	v, err := Inspect(h)
	if err != nil {
		t.Fatal(err)
	}
	if notes := strings.Join(v.Notes, "\n"); !strings.Contains(notes, "the IPv6 underlay beside") ||
		strings.Contains(notes, dev6+": only one routed") {
		t.Fatalf("the record's notes after the upgrade:\n%s", notes)
	}

	// The upgraded programs serve the pods' IPv6 over flannel-v6.1.
	target := net.JoinHostPort(c2.Addr6Only(), strconv.Itoa(lab.VerifyPort))
	ln, err := netnsutil.Listen(c2.Netns, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go lab.ServeTCPEchoFor(ln, c2.Name, 0)
	conn, err := netnsutil.DialContext(context.Background(), c1.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != c2.Name {
		t.Fatalf("greeting %q, %v", line, err)
	}
	eg0, _ := counters(t, h)
	n, err := streamEcho(conn, r, 2*time.Second, 65)
	if err != nil {
		t.Fatalf("IPv6 stream: %v (%d bytes echoed)", err, n)
	}
	eg, _ := counters(t, h)
	for k := range eg {
		eg[k] -= eg0[k]
	}
	t.Logf("IPv6 over the IPv6 underlay after the upgrade: %d bytes echoed; egress %v", n, eg)
	if seen := eg["hit"] + eg["miss"] + eg["stale"]; eg["hit"] == 0 || eg["hit"]*100 < seen*99 || eg["dropped"] != 0 {
		t.Fatalf("egress %v: want >= 99%% of the stream on the upgraded fast path, none dropped", eg)
	}
}

// installOlderPrograms puts an "older" program (another tag: it returns TC_ACT_UNSPEC, the
// normal path) in every pinned tcx link of host's attachment and in the pin of the program it
// replaced, as an attachment of an older binary has them; it returns how many links it changed.
func installOlderPrograms(t *testing.T, host string) int {
	t.Helper()
	dir := datapath.ModePinDir(host, Name)
	p, err := openPinned(host, 0)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[ebpf.ProgramID]string{}
	for name, prog := range progsOf(&p.fpPrograms) {
		if info, err := prog.Info(); err == nil {
			if id, ok := info.ID(); ok {
				byID[id] = name
			}
		}
	}
	p.Close()
	older := map[string]*ebpf.Program{}
	defer func() {
		for _, o := range older {
			o.Close()
		}
	}()
	pins, err := linkPins(host)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pin := range pins {
		lk, err := link.LoadPinnedLink(filepath.Join(dir, linksSub, pin), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := lk.Info()
		name := ""
		if err == nil {
			name = byID[info.Program]
		}
		if name == "" {
			lk.Close()
			t.Fatalf("link %s runs none of the pinned programs", pin)
		}
		o := older[name]
		if o == nil {
			if o, err = ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}}); err != nil {
				t.Fatal(err)
			}
			older[name] = o
			_ = os.Remove(filepath.Join(dir, name))
			if err := o.Pin(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := lk.Update(o); err != nil {
			t.Fatal(err)
		}
		lk.Close()
		n++
	}
	return n
}
