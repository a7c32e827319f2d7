package k8s

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// What tests and benchmarks need to look inside the cluster.

// PodNetns is the path of a pod's network namespace (/proc/<pid>/ns/net of its first
// container), found through its node's containerd.
func (c *Cluster) PodNetns(ctx context.Context, namespace, pod string) (string, error) {
	out, err := c.Kubectl(ctx, "get", "pod", "-n", namespace, pod, "-o", `jsonpath={.spec.nodeName} {.status.containerStatuses[0].containerID}`)
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return "", fmt.Errorf("pod %s/%s has no running container yet (%q)", namespace, pod, out)
	}
	i, err := c.NodeIndex(f[0])
	if err != nil {
		return "", err
	}
	id := strings.TrimPrefix(f[1], "containerd://")
	tl, err := exec.CommandContext(ctx, "ctr", "-a", c.sock(i), "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return "", fmt.Errorf("ctr tasks ls on %s: %w", f[0], err)
	}
	for _, l := range strings.Split(string(tl), "\n") {
		fs := strings.Fields(l)
		if len(fs) >= 2 && fs[0] == id {
			return "/proc/" + fs[1] + "/ns/net", nil
		}
	}
	return "", fmt.Errorf("pod %s/%s: container %s not among %s's tasks", namespace, pod, id, f[0])
}

// NodeOf is the node index a pod runs on.
func (c *Cluster) NodeOf(p Pod) int {
	i, _ := c.NodeIndex(p.Node)
	return i
}

// Metrics scrapes node i's agent (http://127.0.0.1:9465/metrics inside the node: the shipped config listens on loopback only) and returns the samples of the
// series named name, keyed by their label text ({a="b",...}).
func (c *Cluster) Metrics(ctx context.Context, i int, name string) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://127.0.0.1:9465/metrics", nil)
	resp, err := httpIn(i).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("metrics on %s: %s", NodeName(i), resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) {
			continue
		}
		rest := l[len(name):]
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[:end+1], rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // a longer name
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err == nil {
			out[labels] = v
		}
	}
	return out, sc.Err()
}

// FastPathHits is the fast path's hit count on node i (both directions), read live from its
// maps by `peregrine status` run in the node (the text lines "fastpath egress : hits N" and
// "fastpath ingress: hits N", the totals over every overlay). Not from the agent's /metrics:
// that serves a snapshot gathered at most once per metrics.DefaultRefresh (5 s), so a count
// read there lags the datapath by up to 5 s, and a test that looks for hits within 1 or 2 s
// saw none (the 5.27 s "new pod on the fast path" and the 0 hits after a rolling update of
// issue 27 were that lag, not the datapath).
func (c *Cluster) FastPathHits(ctx context.Context, i int) (float64, error) {
	if c.Spec.AgentBinary == "" {
		return 0, fmt.Errorf("fast path hits on %s: the cluster has no agent binary", NodeName(i))
	}
	out, err := Exec(ctx, i, c.Spec.AgentBinary, "status").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("peregrine status on %s: %w: %s", NodeName(i), err, strings.TrimSpace(string(out)))
	}
	return parseFastPathHits(string(out))
}

// parseFastPathHits sums the hits of the "fastpath egress" and "fastpath ingress" lines of
// `peregrine status`; it fails when either line is missing (nothing attached, another format).
func parseFastPathHits(status string) (float64, error) {
	var sum float64
	seen := 0
	for _, l := range strings.Split(status, "\n") {
		l = strings.TrimSpace(l)
		rest, ok := strings.CutPrefix(l, "fastpath egress")
		if !ok {
			rest, ok = strings.CutPrefix(l, "fastpath ingress")
		}
		if !ok {
			continue
		}
		rest = strings.TrimLeft(rest, " ")
		rest, ok = strings.CutPrefix(rest, ": hits ")
		if !ok {
			continue
		}
		n := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if n < 0 {
			n = len(rest)
		}
		v, err := strconv.ParseFloat(rest[:n], 64)
		if err != nil {
			return 0, fmt.Errorf("fast path hits in %q: %w", l, err)
		}
		sum += v
		seen++
	}
	if seen != 2 {
		return 0, fmt.Errorf("peregrine status shows no fast path counters (%d of 2 lines):\n%s", seen, status)
	}
	return sum, nil
}

// API returns an HTTP client for the apiserver as its admin (from node 1), and its base URL:
// cheaper than kubectl for a test that polls.
func (c *Cluster) API() (*http.Client, string, error) {
	cert, err := tls.LoadX509KeyPair(c.pkiPath("admin.crt"), c.pkiPath("admin.key"))
	if err != nil {
		return nil, "", err
	}
	ca, err := os.ReadFile(c.pkiPath("ca.crt"))
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cl := httpIn(1)
	cl.Transport.(*http.Transport).TLSClientConfig = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}
	cl.Transport.(*http.Transport).DisableKeepAlives = false
	return cl, "https://" + APIServer().String() + ":6443", nil
}

func (c *Cluster) pkiPath(f string) string { return c.Dir + "/pki/" + f }

// ReadAll is io.ReadAll, for callers of API.
var ReadAll = io.ReadAll
