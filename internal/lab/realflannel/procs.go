package realflannel

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/proc"
)

// The processes the lab starts run in their own session (they outlive `lab real-flannel up`),
// each with a pid file <dir>/<tag>.pid and a log <dir>/<tag>.log. Down kills by pid file after
// checking the pid is still that program, then whatever else runs in the lab's namespaces.

func (l *Lab) flanneldLog(i int) string { return filepath.Join(l.nodeDir(i), "flanneld.log") }
func (l *Lab) subnetFile(i int) string  { return filepath.Join(l.nodeDir(i), "subnet.env") }

// etcdPrefix is the lab's own key prefix: two labs never share a subnet store.
func (l *Lab) etcdPrefix() string { return "/prg/" + l.Spec.Name + "/network" }

func (l *Lab) etcdURL() string { return "http://" + netip.AddrPortFrom(l.etcdAddr(), 2379).String() }

func etcdVersion(ctx context.Context, bin string) string {
	out, _ := exec.CommandContext(ctx, bin, "--version").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "etcd Version: "); ok {
			return strings.TrimSpace(v)
		}
	}
	return "(version unknown)"
}

// start runs argv in namespace ns in the background, with its pid file and log in dir.
func start(ns, dir, tag string, argv ...string) error {
	// `ip netns exec` enters the namespace and execs argv: the pid is the program's.
	a := append([]string{"ip", "netns", "exec", ns}, argv...)
	if err := proc.Start(a, nil, filepath.Join(dir, tag+".log"), filepath.Join(dir, tag+".pid")); err != nil {
		return fmt.Errorf("start %s in %s: %w", argv[0], ns, err)
	}
	return nil
}

func (l *Lab) startEtcd(ctx context.Context) error {
	peer := "http://127.0.0.1:2380" // its namespace's own loopback
	name := NetName(l.Spec.Name)
	if err := start(l.etcdNetns(), l.Dir, "etcd", l.Bin.Etcd,
		"--name", name, "--data-dir", filepath.Join(l.Dir, "etcd-data"),
		"--listen-client-urls", l.etcdURL(), "--advertise-client-urls", l.etcdURL(),
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", name+"="+peer, "--initial-cluster-state", "new"); err != nil {
		return err
	}
	c := l.etcdClient()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := c.Get(l.etcdURL() + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && bytes.Contains(b, []byte(`"true"`)) {
				break
			}
			err = fmt.Errorf("%s: %s", resp.Status, b)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy after 15 s: %v (log: %s)", err, filepath.Join(l.Dir, "etcd.log"))
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	// flannel's network config, through etcd's v3 JSON gateway.
	cfg := fmt.Sprintf(`{"Network":%q,"SubnetLen":24,"Backend":{"Type":"vxlan"}}`, FlannelNetwork)
	body, _ := json.Marshal(map[string]string{
		"key":   base64.StdEncoding.EncodeToString([]byte(l.etcdPrefix() + "/config")),
		"value": base64.StdEncoding.EncodeToString([]byte(cfg)),
	})
	resp, err := c.Post(l.etcdURL()+"/v3/kv/put", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("write flannel's network config to etcd: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("write flannel's network config to etcd: %s: %s", resp.Status, b)
	}
	return nil
}

// etcdClient talks to etcd from inside its namespace (its only listener is there).
func (l *Lab) etcdClient() *http.Client { return netnsutil.HTTPClient(l.etcdNetns(), 3*time.Second) }

// startFlanneld runs node i's flanneld as kube-flannel's manifest does (--ip-masq): flanneld
// masquerades only traffic leaving the flannel network, and its subnet file tells the CNI plugin
// not to (without it, the bridge plugin would masquerade pod-to-pod traffic between nodes).
func (l *Lab) startFlanneld(ctx context.Context, i int) error {
	if l.Spec.NoUDPCsum {
		ns := nodeNetns(l.Spec.Name, i)
		if out, _ := netnsutil.Run(ctx, ns, "ip", "-br", "link", "show", "flannel.1"); strings.TrimSpace(out) == "" {
			// flanneld's own device (VNI 1, port 8472, local = eth0's address, no learning) but
			// for the flag: vxlanLinksIncompat in flanneld ignores it, so flanneld adopts it.
			if _, err := netnsutil.Run(ctx, ns, "ip", "link", "add", "flannel.1", "type", "vxlan", "id", "1",
				"local", nthAddr(underlayCIDR, i).String(), "dev", UnderlayDev, "dstport", "8472", "nolearning", "noudpcsum"); err != nil {
				return fmt.Errorf("%s: make flannel.1 with noudpcsum: %w", ns, err)
			}
		}
	}
	return start(nodeNetns(l.Spec.Name, i), l.nodeDir(i), "flanneld", l.Bin.Flanneld,
		"-etcd-endpoints", l.etcdURL(), "-etcd-prefix", l.etcdPrefix(),
		"-iface", UnderlayDev, "-subnet-file", l.subnetFile(i), "-ip-masq")
}

// waitLease waits until node i's flanneld has written its subnet file (after since, for a
// restart) and flannel.1 is up, and records the node's subnet.
func (l *Lab) waitLease(ctx context.Context, i int, since time.Time) error {
	n, err := l.Node(i)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, serr := os.Stat(l.subnetFile(i))
		if serr == nil && st.ModTime().After(since) {
			if p, err := readSubnetFile(l.subnetFile(i)); err == nil {
				if out, _ := netnsutil.Run(ctx, n.Netns, "ip", "-br", "link", "show", "flannel.1"); strings.Contains(out, "UP") || strings.Contains(out, "UNKNOWN") {
					n.Subnet = p
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("flanneld on %s: no lease after 20 s (log: %s)", n.Netns, l.flanneldLog(i))
		}
		if !proc.Alive(l.pidFile(i)) {
			b, _ := os.ReadFile(l.flanneldLog(i))
			return fmt.Errorf("flanneld on %s exited:\n%s", n.Netns, tail(string(b), 2000))
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func (l *Lab) pidFile(i int) string { return filepath.Join(l.nodeDir(i), "flanneld.pid") }

// RestartFlanneld stops node i's flanneld and starts it again, as an upgrade or a crash loop
// would: it keeps its lease (the subnet file) and programs flannel.1's neighbour and FDB entries
// and routes anew. It returns once the new flanneld has rewritten the subnet file.
func (l *Lab) RestartFlanneld(ctx context.Context, i int) error {
	if _, err := l.Node(i); err != nil {
		return err
	}
	if err := killPidFile(l.pidFile(i), "flanneld"); err != nil {
		return err
	}
	since := time.Now()
	if err := l.startFlanneld(ctx, i); err != nil {
		return err
	}
	return l.waitLease(ctx, i, since)
}

// killAll kills every process the lab's pid files name: flanneld first, then etcd.
func (l *Lab) killAll() []error {
	var errs []error
	pids, _ := filepath.Glob(filepath.Join(l.Dir, "n*", "flanneld.pid"))
	for _, p := range pids {
		if err := killPidFile(p, "flanneld"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := killPidFile(filepath.Join(l.Dir, "etcd.pid"), "etcd"); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// killPidFile stops the program a pid file names (TERM, then KILL after 3 s) and removes the
// file. A file naming nothing running, or another program (a reused pid), is removed quietly.
func killPidFile(pidFile, prog string) error { return proc.Stop(pidFile, 3*time.Second, prog) }

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
