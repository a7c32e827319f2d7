package agent

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// TestMain: this test binary run as `BIN agent --config FILE --netns NS` is a node agent (the
// tests kill -9 it and start it again); otherwise it runs the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(runAsAgent(os.Args[2:]))
	}
	datapath.UseRuntime(datapath.Runtime{NodeAgentRunning: NodeAgentRunning}) // as the CLI's Main
	agenttest.Main(m)
}

func runAsAgent(args []string) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	config := fs.String("config", "", "")
	netns := fs.String("netns", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err := Run(context.Background(), Options{ConfigPath: *config, Netns: *netns, NetnsSet: true}); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	return 0
}

// agentProc is a node agent run as a process of its own (with no Proc: one run inside the
// test's process, of which only the HTTP port is used).
type agentProc struct {
	*testutil.Proc
	port int
}

// writeConfig writes a config for an agent of target listening on port.
func writeConfig(t *testing.T, path, modes string, port int) {
	t.Helper()
	text := configText(modes, port)
	if err := os.WriteFile(path+".tmp", []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil { // whole, as a ConfigMap update is
		t.Fatal(err)
	}
}

func configText(modes string, port int) string {
	return fmt.Sprintf("modes:\n%slisten: 127.0.0.1:%d\nreconcile_interval: 500ms\n", modes, port)
}

// configMapUpdate writes text as the kubelet updates a mounted ConfigMap: into a new directory
// of dir, then swaps the ..data symlink to it; dir/config.yaml is a symlink through ..data. It
// returns the config's path.
func configMapUpdate(t *testing.T, dir, text string) string {
	t.Helper()
	gen := filepath.Join(dir, fmt.Sprintf("..%d", time.Now().UnixNano()))
	if err := os.Mkdir(gen, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gen, "config.yaml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	if _, err := os.Lstat(path); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", "config.yaml"), path); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startAgent(t *testing.T, cfg, netns string, port int) *agentProc {
	t.Helper()
	p, err := testutil.StartProc(t, exec.Command(os.Args[0], "agent", "--config", cfg, "--netns", netns))
	if err != nil {
		t.Fatal(err)
	}
	return &agentProc{Proc: p, port: port}
}

func (p *agentProc) get(path string) (int, string) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", p.port, path))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b)
}

func (p *agentProc) waitReady(t *testing.T, within time.Duration) {
	t.Helper()
	labtest.Eventually(t, within, "the agent's /readyz answers 200", func() (bool, string) {
		if !p.Alive() {
			return false, fmt.Sprintf("the agent exited: %v", p.Exit())
		}
		code, body := p.get("/readyz")
		return code == 200, fmt.Sprintf("%d %s", code, body)
	})
}

func (p *agentProc) kill9(t *testing.T) {
	t.Helper()
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	_ = p.Exit()
}

// stop sends SIGTERM and wants exit 0.
func (p *agentProc) stop(t *testing.T) {
	t.Helper()
	exited, err := p.Stop(syscall.SIGTERM, 10*time.Second)
	if !exited {
		t.Fatal("the agent did not exit on SIGTERM")
	}
	if err != nil {
		t.Errorf("the agent exited on SIGTERM with %v, want 0", err)
	}
}

// linkIDs are the IDs of mode's pinned tcx links on target, by pin name.
func linkIDs(t *testing.T, target, mode string) map[string]link.ID {
	t.Helper()
	dir := filepath.Join(datapath.ModePinDir(target, mode), "links")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]link.ID{}
	for _, e := range ents {
		l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
		if errors.Is(err, os.ErrNotExist) {
			// Unpinned between the listing and the open: the agent's Repair removes the pin
			// of a link detached by hand before it attaches the piece again.
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		if info.TCX() != nil && info.TCX().Ifindex == 0 {
			continue // detached
		}
		out[e.Name()] = info.ID
	}
	return out
}

// mapID is the ID of a pinned map (a new attach makes new maps).
func mapID(t *testing.T, target, mode, name string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(datapath.ModePinDir(target, mode), name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// tcpResets is the namespace's TCP EstabResets + OutRsts (/proc/net/snmp).
func tcpResets(t *testing.T, ns string) uint64 {
	t.Helper()
	var text string
	if err := netnsutil.Do(ns, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		text = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var names []string
	var total uint64
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, v := range f {
			if i < len(names) && (names[i] == "EstabResets" || names[i] == "OutRsts") {
				n, _ := strconv.ParseUint(v, 10, 64)
				total += n
			}
		}
	}
	return total
}
