package pipedevice

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// twoNamespaces makes two network namespaces joined by a veth pair, with 198.19.254.1 in the
// first and 198.19.254.2 in the second (two "containers"), and removes them at the end.
func twoNamespaces(t *testing.T) (string, string) {
	return vethPair(t, "", "198.19.254.1", "198.19.254.2")
}

// vethPair makes two namespaces (names tagged with tag) joined by a veth pair, ipA in the first
// and ipB in the second: one tenant's two containers, on a segment of their own.
func vethPair(t *testing.T, tag, ipA, ipB string) (string, string) {
	t.Helper()
	testutil.RequireRoot(t)
	id := strconv.Itoa(os.Getpid()) + tag
	a, b := "prg-pdt"+id+"-a", "prg-pdt"+id+"-b"
	va, vb := "prgpd"+id+"a", "prgpd"+id+"b"
	t.Cleanup(func() {
		netnsutil.Delete(a)
		netnsutil.Delete(b)
	})
	for _, ns := range []string{a, b} {
		if err := netnsutil.Create(ns); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("link", "add", va, "netns", a, "type", "veth", "peer", "name", vb, "netns", b)
	run("-n", a, "addr", "add", ipA+"/24", "dev", va)
	run("-n", b, "addr", "add", ipB+"/24", "dev", vb)
	for _, x := range [][2]string{{a, va}, {b, vb}, {a, "lo"}, {b, "lo"}} {
		run("-n", x[0], "link", "set", x[1], "up")
	}
	return a, b
}

// socketDir is a private directory for a daemon socket that an unprivileged client can reach.
func socketDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "prg-pd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	return dir
}

// A container (another network namespace, an unprivileged user) binds only its own addresses,
// reaches no other namespace's loopback, cannot open the daemon's ring memory, and its forged
// queue entries reach nobody.
func TestIsolation(t *testing.T) {
	nsA, nsB := twoNamespaces(t)
	d := startDaemonAt(t, Config{}, filepath.Join(socketDir(t), "pd.sock"))

	// the victim: two clients of the root namespace with a connection carrying known data, and
	// a listener on this namespace's loopback; a few sockets first so ids differ from the helper's
	a, b := dial(t, d), dial(t, d)
	for i := 0; i < 10; i++ {
		mustSocket(t, b)
	}
	cs, ss := pair(t, a, b, 7800)
	vl := listenOn(t, b, netip.MustParseAddrPort("127.0.0.1:7801"), 4)
	transfer(t, a, b, cs, ss, 100000, 1000)
	rx0 := load64(b.socks[ss].hdr, ShRxTail)
	copied0 := d.Status().BytesCopied

	// a listener in namespace B
	lst, lout := startHelper(t, "listen", nsB, "PD_SOCK="+d.cfg.Socket, "PD_LISTEN=198.19.254.2:7900")
	if l := readLine(t, lout, 20*time.Second); l != "ready" {
		t.Fatalf("listener helper: %q", l)
	}

	cmd, out := startHelper(t, "isolation", nsA, "PD_SOCK="+d.cfg.Socket, "PD_OWN=198.19.254.1", "PD_FOREIGN=198.19.254.2",
		"PD_FOREIGNPORT=7900", "PD_LOOPPORT=7801", fmt.Sprintf("PD_DAEMONPID=%d", os.Getpid()), fmt.Sprintf("PD_FOREIGNSID=%d", vl))
	line := readLine(t, out, 30*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("isolation helper: %v (%s)", err, line)
	}
	var rep isolationReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	t.Logf("helper: %+v", rep)
	if rep.UID != 65534 {
		t.Fatalf("helper runs as uid %d", rep.UID)
	}
	expect(t, "bind another namespace's address", rep.BindForeign, "EADDRNOTAVAIL")
	expect(t, "bind its own address", rep.BindOwn, "ok")
	expect(t, "connect to another namespace's loopback listener", rep.ConnectLoopback, "ECONNREFUSED")
	expect(t, "connect to a listener on another namespace's address (the point of PipeDevice)", rep.ConnectForeign, "ok")
	expect(t, "accept on a socket id only another process has", rep.ForeignSID, "EBADF")
	if rep.DaemonFDsOpened != 0 || rep.DaemonFDsTried == 0 {
		t.Errorf("opened %d of the daemon's %d fds (its rings)", rep.DaemonFDsOpened, rep.DaemonFDsTried)
	}
	if rep.MapFilesOpened != 0 || rep.MemOpened {
		t.Errorf("opened %d of the daemon's mappings, /proc/pid/mem %v", rep.MapFilesOpened, rep.MemOpened)
	}
	if rep.ForgedAccepted != 0 || rep.ForgedFailed == 0 {
		t.Errorf("forged sends: %d accepted, %d failed", rep.ForgedAccepted, rep.ForgedFailed)
	}
	// nothing reached the victims
	if got := load64(b.socks[ss].hdr, ShRxTail); got != rx0 {
		t.Errorf("the victim's ring moved from %d to %d", rx0, got)
	}
	if _, _, err := b.Accept(vl); err == nil {
		t.Error("the loopback listener got a connection from another namespace")
	}
	if c := d.Status().BytesCopied; c != copied0 {
		t.Errorf("the engine copied %d bytes for the forged entries", c-copied0)
	}
	helperStdin[lst].Close()
	if l := readLine(t, lout, 10*time.Second); l != "accepted 1 bytes 0" {
		t.Errorf("namespace B's listener: %q, want one connection and no bytes", l)
	}
	// the daemon is fine: a transfer still checks out
	transfer(t, a, b, cs, ss, 1<<20, 3000)
}

// bridged makes n namespaces whose veths hang on one bridge (in a namespace of its own, as a
// docker overlay has it): one tenant's containers, ips[i] in the i-th.
func bridged(t *testing.T, tag string, ips ...string) []string {
	t.Helper()
	testutil.RequireRoot(t)
	id := strconv.Itoa(os.Getpid()) + tag
	br := "prg-pdt" + id + "-br"
	names := []string{br}
	for i := range ips {
		names = append(names, fmt.Sprintf("prg-pdt%s-%d", id, i))
	}
	t.Cleanup(func() {
		for _, ns := range names {
			netnsutil.Delete(ns)
		}
	})
	for _, ns := range names {
		if err := netnsutil.Create(ns); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("-n", br, "link", "add", "br0", "type", "bridge")
	run("-n", br, "link", "set", "br0", "up")
	for i, ip := range ips {
		ns, v := names[i+1], fmt.Sprintf("prgpd%s%d", id, i)
		run("link", "add", v, "netns", ns, "type", "veth", "peer", "name", "p"+strconv.Itoa(i), "netns", br)
		run("-n", br, "link", "set", "p"+strconv.Itoa(i), "master", "br0", "up")
		run("-n", ns, "addr", "add", ip+"/24", "dev", v)
		run("-n", ns, "link", "set", v, "up")
	}
	return names[1:]
}

// helperConnect connects to PD_ADDR and prints the errno name.
func helperConnect() error {
	c, err := Dial(os.Getenv("PD_SOCK"), 0, 0)
	if err != nil {
		return err
	}
	s, err := c.Socket()
	if err != nil {
		return err
	}
	fmt.Println(errName(c.Connect(s, netip.MustParseAddrPort(os.Getenv("PD_ADDR")))))
	return nil
}

// On one bridge (one tenant), a listener at an address one namespace holds is reached from the
// others; an address two namespaces of the domain hold is ambiguous and refused.
func TestAmbiguousAddress(t *testing.T) {
	ns := bridged(t, "amb", "198.19.252.1", "198.19.252.2", "198.19.252.2", "198.19.252.3")
	d := startDaemonAt(t, Config{}, filepath.Join(socketDir(t), "pd.sock"))
	for _, x := range []struct{ ns, addr string }{{ns[0], "198.19.252.1:7990"}, {ns[1], "198.19.252.2:7990"}, {ns[2], "198.19.252.2:7990"}} {
		_, out := startHelper(t, "listen", x.ns, "PD_SOCK="+d.cfg.Socket, "PD_LISTEN="+x.addr)
		if l := readLine(t, out, 20*time.Second); l != "ready" {
			t.Fatalf("listener in %s: %q", x.ns, l)
		}
	}
	for _, x := range []struct{ addr, want string }{{"198.19.252.1:7990", "ok"}, {"198.19.252.2:7990", "ECONNREFUSED"}} {
		cmd, out := startHelper(t, "connect", ns[3], "PD_SOCK="+d.cfg.Socket, "PD_ADDR="+x.addr)
		expect(t, "connect to "+x.addr, readLine(t, out, 20*time.Second), x.want)
		cmd.Wait()
	}
}
