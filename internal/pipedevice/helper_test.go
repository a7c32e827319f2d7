package pipedevice

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Some tests need a second process: one to kill -9, one in another network namespace, one
// running as an unprivileged user. The test binary re-executes itself with PD_TEST_HELPER set.
func TestMain(m *testing.M) {
	if h := os.Getenv("PD_TEST_HELPER"); h != "" {
		os.Exit(runHelper(h))
	}
	os.Exit(m.Run())
}

func runHelper(name string) int {
	var err error
	switch name {
	case "crash":
		err = helperCrash()
	case "isolation":
		err = helperIsolation()
	case "listen":
		err = helperListen()
	case "attack":
		err = helperAttack()
	case "daemon":
		err = helperDaemon()
	case "stream":
		err = helperStream()
	case "connect":
		err = helperConnect()
	default:
		err = fmt.Errorf("unknown helper %q", name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// helperCrash connects to PD_ADDR, sends PD_BYTES bytes, binds and listens on PD_LISTEN, says
// "ready" and waits to be killed.
func helperCrash() error {
	c, err := Dial(os.Getenv("PD_SOCK"), 0, 0)
	if err != nil {
		return err
	}
	sid, err := c.Socket()
	if err != nil {
		return err
	}
	if err := c.Connect(sid, netip.MustParseAddrPort(os.Getenv("PD_ADDR"))); err != nil {
		return err
	}
	n, _ := strconv.Atoi(os.Getenv("PD_BYTES"))
	buf, err := c.Malloc(-1, n)
	if err != nil {
		return err
	}
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	if err := sendAll(c, sid, buf); err != nil {
		return err
	}
	if _, err := listenEnv(c, 4); err != nil {
		return err
	}
	fmt.Println("ready")
	select {}
}

// listenEnv opens a listener on PD_LISTEN with the given backlog.
func listenEnv(c *Client, backlog int) (int, error) {
	l, err := c.Socket()
	if err != nil {
		return 0, err
	}
	if _, err := c.Bind(l, netip.MustParseAddrPort(os.Getenv("PD_LISTEN"))); err != nil {
		return 0, err
	}
	return l, c.Listen(l, backlog)
}

// helperListen listens on PD_LISTEN, says "ready", accepts what comes until stdin closes, then
// says how many connections it accepted and how many bytes reached them.
func helperListen() error {
	c, err := Dial(os.Getenv("PD_SOCK"), 0, 0)
	if err != nil {
		return err
	}
	l, err := listenEnv(c, 16)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	done := make(chan struct{})
	go func() {
		b := make([]byte, 1)
		os.Stdin.Read(b)
		close(done)
	}()
	var socks []int
	for {
		select {
		case <-done:
			for {
				s, _, err := c.Accept(l) // what came in since the last look
				if err != nil {
					break
				}
				socks = append(socks, s)
			}
			var bytes uint64
			for _, s := range socks {
				bytes += load64(c.socks[s].hdr, ShRxTail)
			}
			fmt.Printf("accepted %d bytes %d\n", len(socks), bytes)
			return nil
		default:
		}
		s, _, err := c.Accept(l)
		if err == nil {
			socks = append(socks, s)
			continue
		}
		if !IsAgain(err) {
			fmt.Fprintln(os.Stderr, "accept:", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// isolationReport is what helperIsolation finds out, as JSON on stdout.
type isolationReport struct {
	UID             int    `json:"uid"`
	BindForeign     string `json:"bind_foreign"`     // errno name
	BindOwn         string `json:"bind_own"`         // "ok"
	ConnectLoopback string `json:"connect_loopback"` // a listener on another namespace's loopback
	ConnectForeign  string `json:"connect_foreign"`  // a listener bound to another namespace's address
	DaemonFDsOpened int    `json:"daemon_fds_opened"`
	DaemonFDsTried  int    `json:"daemon_fds_tried"`
	MapFilesOpened  int    `json:"map_files_opened"`
	MemOpened       bool   `json:"mem_opened"`
	ForgedFailed    int    `json:"forged_failed"` // completions with ReqFailed for forged entries
	ForgedAccepted  int    `json:"forged_accepted"`
	ForeignSID      string `json:"foreign_sid"` // accept on a socket id that only the other process has
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	if e, ok := err.(unix.Errno); ok {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

// helperIsolation runs in another network namespace as uid 65534 and tries what a hostile
// container would.
func helperIsolation() error {
	if err := dropPrivileges(); err != nil {
		return err
	}
	rep := isolationReport{UID: os.Getuid()}
	c, err := Dial(os.Getenv("PD_SOCK"), 0, 0)
	if err != nil {
		return err
	}
	s, _ := c.Socket()
	_, err = c.Bind(s, netip.MustParseAddrPort(os.Getenv("PD_FOREIGN")+":9000"))
	rep.BindForeign = errName(err)
	_, err = c.Bind(s, netip.MustParseAddrPort(os.Getenv("PD_OWN")+":9000"))
	rep.BindOwn = errName(err)
	s2, _ := c.Socket()
	rep.ConnectLoopback = errName(c.Connect(s2, netip.MustParseAddrPort("127.0.0.1:"+os.Getenv("PD_LOOPPORT"))))
	s3, _ := c.Socket()
	rep.ConnectForeign = errName(c.Connect(s3, netip.MustParseAddrPort(os.Getenv("PD_FOREIGN")+":"+os.Getenv("PD_FOREIGNPORT"))))

	// The daemon's memory: its fds (every ring is one), its mappings, its address space.
	pid := os.Getenv("PD_DAEMONPID")
	ents, _ := os.ReadDir("/proc/" + pid + "/fd")
	for _, e := range ents {
		rep.DaemonFDsTried++
		if f, err := os.Open("/proc/" + pid + "/fd/" + e.Name()); err == nil {
			rep.DaemonFDsOpened++
			f.Close()
		}
	}
	if rep.DaemonFDsTried == 0 {
		// listing itself is refused: try the numbers the rings have
		for fd := 3; fd < 200; fd++ {
			rep.DaemonFDsTried++
			if f, err := os.Open(fmt.Sprintf("/proc/%s/fd/%d", pid, fd)); err == nil {
				rep.DaemonFDsOpened++
				f.Close()
			}
		}
	}
	if ents, err := os.ReadDir("/proc/" + pid + "/map_files"); err == nil {
		for _, e := range ents {
			if f, err := os.Open("/proc/" + pid + "/map_files/" + e.Name()); err == nil {
				rep.MapFilesOpened++
				f.Close()
			}
		}
	}
	if f, err := os.Open("/proc/" + pid + "/mem"); err == nil {
		rep.MemOpened = true
		f.Close()
	}

	// Socket ids are per process: the other process's listener id means nothing here.
	fsid, _ := strconv.Atoi(os.Getenv("PD_FOREIGNSID"))
	_, _, err = c.Accept(fsid)
	rep.ForeignSID = errName(err)

	// Forged queue entries: sends and releases on socket ids it does not have, sources far
	// outside its pool. None may reach another process.
	var es []Entry
	for id := 0; id < 64; id++ {
		if id == s || id == s2 || id == s3 || id == fsid {
			continue
		}
		es = append(es, Entry{Type: ReqSend, DataLen: 4096, Src: 1 << 40, CID: 1, ConnID: uint16(id)},
			Entry{Type: ReqRelease, Dst: 1 << 20, ConnID: uint16(id)})
	}
	es = append(es, Entry{Type: ReqSend, DataLen: 4096, ConnID: uint16(fsid)}, Entry{Type: ReqSend, DataLen: 4096, ConnID: 65535})
	for len(es) > 0 {
		k := min(len(es), 32)
		if !c.sqs[0].Push(es[:k]...) {
			c.ring()
			time.Sleep(time.Millisecond)
			continue
		}
		c.ring()
		es = es[k:]
	}
	want := 0
	for id := 0; id < 64; id++ {
		if id != s && id != s2 && id != s3 && id != fsid {
			want++
		}
	}
	want += 2
	deadline := time.Now().Add(10 * time.Second)
	var e Entry
	for rep.ForgedFailed+rep.ForgedAccepted < want && time.Now().Before(deadline) {
		got := false
		for _, cq := range c.cqs {
			for cq.Pop(&e) {
				got = true
				if e.Type == ReqFailed {
					rep.ForgedFailed++
				} else {
					rep.ForgedAccepted++
				}
			}
		}
		if !got {
			time.Sleep(time.Millisecond)
		}
	}
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// startHelper runs the test binary as helper name (in network namespace ns when not empty)
// and returns it once it printed its first line (or ended).
func startHelper(t *testing.T, name, ns string, env ...string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	argv := []string{os.Args[0], "-test.run=^$"}
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), append([]string{"PD_TEST_HELPER=" + name}, env...)...)
	cmd.Stderr = &prefixWriter{t: t, prefix: name + ": "}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	helperStdin[cmd] = in
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, bufio.NewReader(out)
}

var helperStdin = map[*exec.Cmd]io.WriteCloser{}

type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(b), nil
}

// readLine reads one line from a helper, failing the test after timeout.
func readLine(t *testing.T, r *bufio.Reader, timeout time.Duration) string {
	t.Helper()
	ch := make(chan string, 1)
	go func() {
		l, _ := r.ReadString('\n')
		ch <- strings.TrimSpace(l)
	}()
	select {
	case l := <-ch:
		return l
	case <-time.After(timeout):
		t.Fatalf("helper said nothing in %v", timeout)
		return ""
	}
}

// eventually polls cond until it holds or the (generous) deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func countFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// sendAll queues all of b (a pd_malloc buffer) on sid, waiting for room (pd_send's short sends).
func sendAll(c *Client, sid int, b []byte) error {
	for off := 0; off < len(b); {
		n, err := c.Send(sid, b[off:])
		if IsAgain(err) {
			c.Wait(func() bool { return c.Room(sid) > 0 }, 10*time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}

// expect compares what a helper reported with what it should have met.
func expect(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %s, want %s", what, got, want)
	}
}
