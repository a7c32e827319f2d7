package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/fastpath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// runInProcess runs a node agent in this test process until the test ends; it returns the
// agent's HTTP port once the first reconcile is done.
func runInProcess(t *testing.T, cfg, netns string, port int) *agentProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan net.Addr, 1)
	go func() {
		done <- Run(ctx, Options{ConfigPath: cfg, Netns: netns, NetnsSet: true, Ready: func(a net.Addr) { ready <- a }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the agent ended with %v, want nil", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("the agent did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not finish its first reconcile")
	}
	return &agentProc{port: port}
}

// TestReconcilePutsBackWhatWasChangedByHand: a fastpath tcx link unpinned by hand (which
// detaches it), one detached with `bpftool link detach`'s system call, prism's link detached and
// unpinned, and an rps knob written by hand are all
// put back within one reconcile interval, touching nothing else. A refused config (a ConfigMap
// update, seen without a SIGHUP) keeps the running state and is reported on /readyz and in the
// status file; the fixed one is taken again.
func TestReconcilePutsBackWhatWasChangedByHand(t *testing.T) {
	testutil.RequireBPF(t)
	l := labtest.Up(t, lab.Spec{Name: "tagr", Style: lab.StyleFlannel, Containers: 1})
	h1 := l.Hosts[0].Netns
	labtest.DetachAtEnd(t, h1)
	cmDir := t.TempDir() // the config arrives as a mounted ConfigMap does
	port := freePort(t)
	const interval = 500 * time.Millisecond
	const modes = "  fastpath: {}\n  rps: {}\n  prism:\n    rules: [\"proto=udp\"]\n"
	cfg := configMapUpdate(t, cmDir, configText(modes, port))
	a := runInProcess(t, cfg, h1, port)
	if code, body := a.get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d %s", code, body)
	}
	if code, body := a.get("/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz %d %s", code, body)
	}
	s := Managing(h1)
	if s == nil || s.PID != os.Getpid() || len(s.Modes) != 3 || s.LastReconcile.IsZero() {
		t.Fatalf("status file: %+v", s)
	}

	before := linkIDs(t, h1, fastpath.Name)
	if len(before) < 2 {
		t.Fatalf("fastpath has %d links", len(before))
	}
	var names []string
	for n := range before {
		names = append(names, n)
	}
	unpinned, detached := names[0], names[1]
	dir := filepath.Join(datapath.ModePinDir(h1, fastpath.Name), "links")
	if err := os.Remove(filepath.Join(dir, unpinned)); err != nil {
		t.Fatal(err)
	}
	lk, err := link.LoadPinnedLink(filepath.Join(dir, detached), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Detach(); err != nil {
		t.Fatal(err)
	}
	lk.Close()
	prismPins := bpfobj.LinkPins(datapath.ModePinDir(h1, "prism"))
	if len(prismPins) == 0 {
		t.Fatal("prism has no link")
	}
	if err := bpfobj.DetachPin(prismPins[0]); err != nil {
		t.Fatal(err)
	}
	st, err := datapath.LoadState(h1, "rps")
	if err != nil || st == nil || len(st.Knobs) == 0 {
		t.Fatalf("rps record: %v %v", st, err)
	}
	k := st.Knobs[0]
	byHand := "1"
	if datapath.SameValue(byHand, k.New) {
		byHand = "2"
	}
	if err := netnsutil.WriteFileIn(k.Netns, k.Path, byHand); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	if live := datapath.CurrentValue(k); datapath.SameValue(live, k.New) {
		t.Fatalf("writing %s by hand did not change %s", byHand, k)
	}
	var took time.Duration
	labtest.Eventually(t, interval+time.Second, "the links and the knob are back", func() (bool, string) {
		now := linkIDs(t, h1, fastpath.Name)
		live := datapath.CurrentValue(k)
		_, a1 := now[unpinned]
		_, a2 := now[detached]
		took = time.Since(changed)
		p := bpfobj.LinkAlive(prismPins[0])
		return a1 && a2 && p && datapath.SameValue(live, k.New), fmt.Sprintf("fastpath links %v, prism's back %v, knob %s", now, p, live)
	})
	t.Logf("put back %s after the change (interval %s)", took.Round(time.Millisecond), interval)
	if took > interval+300*time.Millisecond {
		t.Errorf("put back after %s: more than one interval (%s)", took, interval)
	}
	after := linkIDs(t, h1, fastpath.Name)
	for n, id := range before {
		if n != unpinned && n != detached && after[n] != id {
			t.Errorf("link %s was replaced (%d -> %d): only the missing pieces should be", n, id, after[n])
		}
	}

	// A refused config: reported, the running state kept.
	configMapUpdate(t, cmDir, "modes:\n  fastpath: {}\n  rps: {}\n  prism:\n    rulez: [x]\nlisten: 127.0.0.1:1\n")
	labtest.Eventually(t, 3*time.Second, "/readyz reports the refused config", func() (bool, string) {
		code, body := a.get("/readyz")
		return code == 503 && strings.Contains(body, "modes.prism.rulez"), fmt.Sprintf("%d %s", code, body)
	})
	labtest.Eventually(t, time.Second, "the status file reports the refused config", func() (bool, string) {
		s := Managing(h1)
		return s != nil && strings.Contains(s.ConfigError, "modes.prism.rulez") && !s.Ready, fmt.Sprintf("%+v", s)
	})
	if sts, _ := datapath.LoadStates(h1); len(sts) != 3 {
		t.Errorf("%d attachments after a refused config, want the 3 running", len(sts))
	}
	if now := linkIDs(t, h1, fastpath.Name); len(now) != len(after) {
		t.Errorf("links changed after a refused config: %v -> %v", after, now)
	}
	configMapUpdate(t, cmDir, configText(modes, port)) // fixed
	labtest.Eventually(t, 3*time.Second, "ready again once the config is fixed", func() (bool, string) {
		code, body := a.get("/readyz")
		return code == 200, fmt.Sprintf("%d %s", code, body)
	})
}

// TestAdoptReplacesAnOlderProgramInPlace: fastpath attached by the CLI (a detached per-mode
// agent) with a program standing for an older binary's on its receive link is adopted by the
// node agent: the link stays (same ID) and now runs this binary's program, the pin too; the
// per-mode agent is replaced by one hosted in the node agent. Nothing is detached.
func TestAdoptReplacesAnOlderProgramInPlace(t *testing.T) {
	testutil.RequireBPF(t)
	l := labtest.Up(t, lab.Spec{Name: "tagu", Style: lab.StyleFlannel, Containers: 1})
	h1 := l.Hosts[0].Netns
	labtest.DetachAtEnd(t, h1)
	st, err := datapath.Attach(context.Background(), h1, fastpath.Name, datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	oldAgent := st.AgentPID
	if !agentproc.Is(oldAgent, fastpath.Name, h1) {
		t.Fatalf("the CLI attach started no per-mode agent (pid %d)", oldAgent)
	}
	older := installOlderRx(t, h1)
	before := linkIDs(t, h1, fastpath.Name)

	cfg := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, cfg, "  fastpath: {}\n", port)
	a := runInProcess(t, cfg, h1, port)
	if code, body := a.get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d %s", code, body)
	}
	after := linkIDs(t, h1, fastpath.Name)
	for n, id := range before {
		if after[n] != id {
			t.Errorf("link %s: id %d -> %d: adoption must not detach or attach", n, id, after[n])
		}
	}
	older.check(t)
	st, err = datapath.LoadState(h1, fastpath.Name)
	if err != nil || st == nil {
		t.Fatal(errors.Join(errors.New("record gone"), err))
	}
	if !st.AgentInNode || st.AgentPID != os.Getpid() || !st.Managed {
		t.Errorf("record after adoption: agent pid %d in node %v managed %v", st.AgentPID, st.AgentInNode, st.Managed)
	}
	if agentproc.Is(oldAgent, fastpath.Name, h1) {
		t.Errorf("the per-mode agent %d still runs beside the node agent", oldAgent)
	}
}

// olderRx is fastpath's receive program replaced, on its link and its pin, by a program that
// stands for an older binary's: it hands every packet on (TCX_NEXT), so the normal path takes
// them.
type olderRx struct {
	host, link       string
	tag, olderTag    string
	pinDir, linksDir string
}

func installOlderRx(t *testing.T, host string) *olderRx {
	t.Helper()
	o := &olderRx{host: host, pinDir: datapath.ModePinDir(host, fastpath.Name)}
	o.linksDir = filepath.Join(o.pinDir, "links")
	rx, err := ebpf.LoadPinnedProgram(filepath.Join(o.pinDir, "prg_fastpath_rx"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rxInfo, _ := rx.Info()
	rxID, _ := rxInfo.ID()
	rx.Close()
	o.tag = rxInfo.Tag
	older, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	olderInfo, _ := older.Info()
	o.olderTag = olderInfo.Tag
	for n := range linkIDs(t, host, fastpath.Name) {
		lk, err := link.LoadPinnedLink(filepath.Join(o.linksDir, n), nil)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := lk.Info(); err == nil && info.Program == rxID {
			o.link = n
			if err := lk.Update(older); err != nil {
				t.Fatal(err)
			}
		}
		lk.Close()
	}
	if o.link == "" {
		t.Fatal("no link runs prg_fastpath_rx")
	}
	if err := os.Remove(filepath.Join(o.pinDir, "prg_fastpath_rx")); err != nil {
		t.Fatal(err)
	}
	if err := older.Pin(filepath.Join(o.pinDir, "prg_fastpath_rx")); err != nil {
		t.Fatal(err)
	}
	return o
}

// check: the link and the pin run this binary's receive program again.
func (o *olderRx) check(t *testing.T) {
	t.Helper()
	lk, err := link.LoadPinnedLink(filepath.Join(o.linksDir, o.link), nil)
	if err != nil {
		t.Fatal(err)
	}
	info, err := lk.Info()
	lk.Close()
	if err != nil {
		t.Fatal(err)
	}
	now, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		t.Fatal(err)
	}
	nowInfo, _ := now.Info()
	now.Close()
	if nowInfo.Tag != o.tag || nowInfo.Tag == o.olderTag {
		t.Errorf("%s: the receive link runs tag %s, want this binary's %s (the older one was %s)", o.host, nowInfo.Tag, o.tag, o.olderTag)
	}
	pinned, err := ebpf.LoadPinnedProgram(filepath.Join(o.pinDir, "prg_fastpath_rx"), nil)
	if err != nil {
		t.Fatal(err)
	}
	pinnedInfo, _ := pinned.Info()
	pinned.Close()
	if pinnedInfo.Tag != o.tag {
		t.Errorf("%s: the pin prg_fastpath_rx holds tag %s, want %s", o.host, pinnedInfo.Tag, o.tag)
	}
}
