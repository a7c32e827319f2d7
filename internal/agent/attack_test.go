package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// Attacker and operator tests of the agent's surface that need no root and no lab (issue 28).

// Item 3: a listen address other than loopback is refused unless acknowledged, and the error
// says why and what to do.
func TestListenBeyondLoopbackNeedsAcknowledging(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:9465", ":9465", "[::]:9465", "10.0.0.5:9465", "node.example:9465"} {
		_, err := ParseConfig([]byte("modes:\n  fastpath: {}\nlisten: \"" + listen + "\"\n"))
		if err == nil {
			t.Errorf("listen %s accepted without listen_remote", listen)
			continue
		}
		for _, want := range []string{"listen:", "every pod on the node", "listen_remote: true", DefaultListen} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("listen %s: error %q does not say %q", listen, err, want)
			}
		}
		c, err := ParseConfig([]byte("modes:\n  fastpath: {}\nlisten: \"" + listen + "\"\nlisten_remote: true\n"))
		if err != nil || c.Listen != listen || !c.ListenRemote {
			t.Errorf("listen %s with listen_remote: %v", listen, err)
		}
	}
	for _, listen := range []string{"127.0.0.1:9465", "127.0.0.2:1", "[::1]:9465", "localhost:9465"} {
		if _, err := ParseConfig([]byte("modes:\n  fastpath: {}\nlisten: \"" + listen + "\"\n")); err != nil {
			t.Errorf("loopback %s refused: %v", listen, err)
		}
	}
	c, err := ParseConfig([]byte("modes:\n  fastpath: {}\n"))
	if err != nil || c.Listen != "127.0.0.1:9465" {
		t.Errorf("default listen %q, %v", c.Listen, err)
	}
	if _, err := ParseConfig([]byte("modes:\n  fastpath: {}\nlisten_remote: yes please\n")); err == nil {
		t.Error("listen_remote: a string accepted")
	}
}

// testAgent is an Agent serving on loopback with its records in a directory of the test's own.
func testAgent(t *testing.T, cfgPath string) (*Agent, string) {
	t.Helper()
	for _, v := range []*string{&datapath.StateDir, &datapath.NodeAgentDir} {
		old := *v
		*v = t.TempDir()
		t.Cleanup(func() { *v = old })
	}
	cfg, err := ReadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{opts: Options{ConfigPath: cfgPath}, cfg: cfg, started: time.Now(), notReady: map[string]string{},
		adopted: map[string]bool{}, beat: time.Now(), last: time.Now(), metricsRefresh: 200 * time.Millisecond}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return a, "http://" + l.Addr().String()
}

func get(c *http.Client, url string) (int, string) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// Item 3: 64 scrapers hammering /metrics (8 curl loops took ~1.8 of 2 CPUs before): the
// metrics are gathered once per refresh period, whatever the request rate; the excess is
// refused with 503; and the kubelet's probes, on their own bound, always answer 200.
func TestMetricsFloodDoesNotCostTheNode(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("modes:\n  fastpath: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, url := testAgent(t, cfg)
	if code, body := get(http.DefaultClient, url+"/metrics"); code != 200 || !strings.Contains(body, "peregrine_softnet_total") {
		t.Fatalf("/metrics: %d %.300s", code, body)
	}
	const clients, period = 64, 2 * time.Second
	before := a.snap.Gathers()
	var probeFail atomic.Int64
	kubelet := make(chan struct{})
	end := time.Now().Add(period)
	go func() { // the kubelet, during the flood
		defer close(kubelet)
		c := &http.Client{Timeout: 5 * time.Second}
		for time.Now().Before(end) {
			for _, p := range []string{"/healthz", "/readyz"} {
				if code, body := get(c, url+p); code != 200 {
					probeFail.Add(1)
					t.Logf("%s: %d %s", p, code, body)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	f := testutil.FloodGET(clients, period, func() *http.Client { return &http.Client{Timeout: 5 * time.Second} }, url+"/metrics")
	<-kubelet
	gathers := a.snap.Gathers() - before
	t.Logf("%d scrapers for %s: %d served, %d refused (503), %d other; %d gatherings", clients, period, f.OK, f.Busy, f.Other, gathers)
	if limit := int64(period/(200*time.Millisecond)) + 2; gathers > limit {
		t.Errorf("%d gatherings, want at most %d: the work per request is not bounded", gathers, limit)
	}
	if f.OK+f.Busy < 10*gathers || f.Other != 0 {
		t.Errorf("the flood: %d served, %d refused, %d other", f.OK, f.Busy, f.Other)
	}
	if probeFail.Load() != 0 {
		t.Errorf("%d probe requests failed during the flood: the kubelet would restart the agent", probeFail.Load())
	}
}

// Item 7: rules_file pointed at a FIFO, /dev/zero, a huge file or a root-only secret. Each is
// refused at once (the loop never blocks), and no error, so nothing /readyz or the status file
// serves, carries the file's text.
func TestRulesFileCannotBlockOrLeak(t *testing.T) {
	dir, fifo, huge := testutil.HostileFiles(t)
	const secret = "root:$6$prgSecretHash$abcdefghijklmnop:19000:0:99999:7:::"
	shadow := filepath.Join(dir, "shadow")
	if err := os.WriteFile(shadow, []byte(secret+"\ndaemon:*:19000:0:99999:7:::\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{
		{fifo, "FIFO"}, {"/dev/zero", "character device"}, {huge, "larger than"}, {shadow, "rule 1"},
	} {
		text := fmt.Sprintf("modes:\n  prism:\n    rules_file: %q\n", c.file)
		done := make(chan error, 1)
		go func() { _, err := ParseConfig([]byte(text)); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("rules_file %s: %v, want an error saying %q", c.file, err, c.want)
			} else if strings.Contains(err.Error(), "prgSecret") || strings.Contains(err.Error(), "daemon") {
				t.Errorf("rules_file %s: the error repeats the file's text: %v", c.file, err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("rules_file %s: the config read blocked", c.file)
		}
	}

	// The same through a running agent: a reload to rules_file: <secret> is refused, and
	// /readyz says so without the secret.
	cfg := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfg, []byte("modes:\n  prism:\n    rules: [\"proto=udp dport=9\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, url := testAgent(t, cfg)
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("modes:\n  prism:\n    rules_file: %q\n", shadow)), 0o600); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(time.Hour)
	defer tick.Stop()
	a.reload(context.Background(), "test", tick)
	code, body := get(http.DefaultClient, url+"/readyz")
	if code != 503 || !strings.Contains(body, "config refused") {
		t.Fatalf("/readyz after a refused config: %d %s", code, body)
	}
	if strings.Contains(body, "prgSecret") || strings.Contains(body, "daemon") {
		t.Errorf("/readyz serves the rules file's text: %s", body)
	}
	st, err := ReadStatus("")
	if err != nil || st == nil || !strings.Contains(st.ConfigError, "rules_file") || strings.Contains(st.ConfigError, "prgSecret") {
		t.Errorf("status file: %+v, %v", st, err)
	}

	// The config file itself a FIFO: the loop's poll and a reload must not block.
	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		if _, err := fileHash(cfg); err != nil {
			t.Errorf("fileHash of a FIFO: %v, want a hash of its error", err)
		}
		a.reload(context.Background(), "test", tick)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("a config that is a FIFO blocked the loop")
	}
	if code, body := get(http.DefaultClient, url+"/readyz"); code != 503 || !strings.Contains(body, "FIFO") {
		t.Errorf("/readyz with the config a FIFO: %d %s", code, body)
	}
}
