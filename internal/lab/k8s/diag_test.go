package k8s

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// diag logs what explains a fast-path failure on the cluster: each node's agent log tail,
// peregrine status, the conntrack table and the filter table's drop counters.
func diag(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	logs, _ := c.Kubectl(ctx, "-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=peregrine", "--tail=40", "--prefix")
	fmt.Fprintf(&b, "agent logs:\n%s\n", logs)
	for i := 1; i <= c.Spec.Nodes; i++ {
		for _, argv := range [][]string{{agentBin, "status"}, {"sh", "-c", "conntrack -L 2>/dev/null | grep -v 'dport=2379\\|dport=6443\\|dport=8472\\|dport=8080\\|dport=9465'"}, {"sh", "-c", "bpftool map dump pinned $(find /sys/fs/bpf -name prg_fastpath_flow | head -1) | head -c 20000"}, {"sh", "-c", "iptables-save -c -t filter | grep -v '^\\[0:0\\]' | grep -i 'invalid\\|DROP\\|REJECT'"}, {"cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"}} {
			out, err := Exec(ctx, i, argv...).CombinedOutput()
			fmt.Fprintf(&b, "--- %s: %s (%v)\n%s\n", NodeName(i), strings.Join(argv, " "), err, out)
		}
	}
	t.Log(b.String())
}

// ctTrace follows conntrack's UDP events on every node while a churn step runs (`conntrack
// -E`, timed when the tool received each event: a few ms after the kernel sent it), so a step
// says when kube-proxy deleted the flow's entry and what the normal path made of it after.
type ctTrace struct {
	mu    sync.Mutex
	lines []string
	cmds  []*exec.Cmd
	wg    sync.WaitGroup
}

func startCTTrace(c *Cluster) *ctTrace {
	tr := &ctTrace{}
	for i := 1; i <= c.Spec.Nodes; i++ {
		cmd := Exec(context.Background(), i, "conntrack", "-E", "-p", "udp", "-o", "timestamp")
		out, err := cmd.StdoutPipe()
		if err != nil || cmd.Start() != nil {
			continue
		}
		tr.cmds = append(tr.cmds, cmd)
		tr.wg.Add(1)
		go func(node string) {
			defer tr.wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				tr.mu.Lock()
				tr.lines = append(tr.lines, node+" "+sc.Text())
				tr.mu.Unlock()
			}
		}(NodeName(i))
	}
	return tr
}

// stop ends the trace.
func (tr *ctTrace) stop() {
	for _, cmd := range tr.cmds {
		_ = cmd.Process.Kill()
	}
	tr.wg.Wait()
	for _, cmd := range tr.cmds {
		_ = cmd.Wait()
	}
}

// ctEvent is one line of `conntrack -E -o timestamp` on a node, its time relative to a change.
type ctEvent struct {
	node string
	at   time.Duration // -1 if the line had no time
	line string        // without the time
}

func (e ctEvent) String() string { return fmt.Sprintf("%s %+v %s", e.node, e.at, e.line) }

// take returns the events so far, with times relative to t0, and drops them.
func (tr *ctTrace) take(t0 time.Time) []ctEvent {
	tr.mu.Lock()
	lines := tr.lines
	tr.lines = nil
	tr.mu.Unlock()
	return parseCT(lines, t0)
}

// peek is take without dropping.
func (tr *ctTrace) peek(t0 time.Time) []ctEvent {
	tr.mu.Lock()
	lines := slices.Clone(tr.lines)
	tr.mu.Unlock()
	return parseCT(lines, t0)
}

func parseCT(lines []string, t0 time.Time) []ctEvent {
	var out []ctEvent
	for _, l := range lines {
		node, rest, _ := strings.Cut(l, " ")
		e := ctEvent{node: node, at: -1, line: rest}
		if strings.HasPrefix(rest, "[") {
			if ts, tail, ok := strings.Cut(rest[1:], "]"); ok {
				if f, err := strconv.ParseFloat(ts, 64); err == nil {
					e.at = time.Unix(0, int64(f*1e9)).Sub(t0).Round(time.Millisecond)
					e.line = strings.TrimSpace(tail)
				}
			}
		}
		out = append(out, e)
	}
	return out
}

// kubeProxyCleanup is when (after the change) node's conntrack destroyed the client's entry to
// the Service that was translated to one of the removed backends (kube-proxy's `conntrack -D
// --orig-dst SVC --dst-nat BACKEND`); -1 if it did not within the events.
func kubeProxyCleanup(evs []ctEvent, node, client string, port int, svc string, removed []string) time.Duration {
	for _, e := range evs {
		if e.node != node || e.at < 0 || !strings.Contains(e.line, "[DESTROY]") {
			continue
		}
		var src, dst, sport []string
		for _, f := range strings.Fields(e.line) {
			k, v, ok := strings.Cut(f, "=")
			switch {
			case !ok:
			case k == "src":
				src = append(src, v)
			case k == "dst":
				dst = append(dst, v)
			case k == "sport":
				sport = append(sport, v)
			}
		}
		if len(src) < 2 || len(dst) < 1 || len(sport) < 1 || src[0] != client || dst[0] != svc || sport[0] != strconv.Itoa(port) {
			continue
		}
		for _, r := range removed {
			if src[1] == r {
				return e.at
			}
		}
	}
	return -1
}

// flowEntries lists node i's cached flows of local address ip (bpftool's JSON of the pinned
// flow map): key, flags, the learn times' age and the translation.
func flowEntries(ctx context.Context, i int, ip string) string {
	out, err := Exec(ctx, i, "sh", "-c", "bpftool -j map dump pinned $(find /sys/fs/bpf -name prg_fastpath_flow | head -1); echo; cat /proc/uptime").Output()
	if err != nil {
		return fmt.Sprintf("bpftool: %v", err)
	}
	js, _, _ := strings.Cut(string(out), "\n")
	var ents []struct {
		Fmt *struct {
			Key   map[string]any `json:"key"`
			Value map[string]any `json:"value"`
		} `json:"formatted"`
	}
	if err := json.Unmarshal([]byte(js), &ents); err != nil {
		return fmt.Sprintf("bpftool json: %v: %.300s", err, js)
	}
	want, _ := netip.ParseAddr(ip)
	addr := func(v any) string {
		n, _ := v.(float64)
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(n))
		return netip.AddrFrom4(b).String()
	}
	port := func(v any) int {
		n, _ := v.(float64)
		return int(uint16(n)>>8 | uint16(n)<<8)
	}
	var b strings.Builder
	for _, e := range ents {
		if e.Fmt == nil {
			return "bpftool: no BTF-formatted entries"
		}
		k, v := e.Fmt.Key, e.Fmt.Value
		if k == nil || addr(k["local"]) != want.String() {
			continue
		}
		fmt.Fprintf(&b, "  %s:%d > %s:%d p%v: flags %v gen %v out_ns %v in_ns %v seen %v nat %s:%d\n", addr(k["local"]), port(k["lport"]),
			addr(k["remote"]), port(k["rport"]), k["proto"], v["flags"], v["gen"], v["out_ns"], v["in_ns"], v["seen_ns"], addr(v["nat_addr"]), port(v["nat_port"]))
	}
	return b.String()
}

func TestKubeProxyCleanup(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	tr := &ctTrace{lines: []string{
		"n1 [1700000001.500000]\t [NEW] udp      17 30 src=10.244.0.5 dst=10.96.0.9 sport=40000 dport=9100 [UNREPLIED] src=10.244.1.7 dst=10.244.0.5 sport=9100 dport=40000",
		"n2 [1700000002.000000]\t [DESTROY] udp      17 src=10.244.0.5 dst=10.96.0.9 sport=40000 dport=9100 src=10.244.1.7 dst=10.244.0.5 sport=9100 dport=40000 [ASSURED]",
		"n1 [1700000002.250000]\t [DESTROY] udp      17 src=10.244.0.5 dst=10.96.0.9 sport=40001 dport=9100 src=10.244.1.7 dst=10.244.0.5 sport=9100 dport=40001 [ASSURED]",
		"n1 [1700000002.500000]\t [DESTROY] udp      17 src=10.244.0.5 dst=10.96.0.9 sport=40000 dport=9100 src=10.244.1.8 dst=10.244.0.5 sport=9100 dport=40000 [ASSURED]",
		"n1 [1700000003.000000]\t [DESTROY] udp      17 src=10.244.0.5 dst=10.96.0.9 sport=40000 dport=9100 packets=3 bytes=99 src=10.244.1.7 dst=10.244.0.5 sport=9100 dport=40000 packets=3 bytes=99 [ASSURED] mark=0 use=1",
	}}
	evs := tr.take(t0)
	// Another node, another client port, another backend do not count; the entry to the
	// removed backend on the client's node does.
	if got := kubeProxyCleanup(evs, "n1", "10.244.0.5", 40000, "10.96.0.9", []string{"10.244.1.7"}); got != 3*time.Second {
		t.Errorf("cleanup at %v, want 3s", got)
	}
	if got := kubeProxyCleanup(evs, "n1", "10.244.0.5", 40000, "10.96.0.9", []string{"10.244.1.9"}); got != -1 {
		t.Errorf("cleanup of a backend never deleted at %v, want -1", got)
	}
	if evs[0].at != 1500*time.Millisecond || !strings.HasPrefix(evs[0].line, "[NEW]") {
		t.Errorf("parsed %+v", evs[0])
	}
}
