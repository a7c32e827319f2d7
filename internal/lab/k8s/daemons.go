package k8s

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// httpIn is an HTTP client whose connections are made from node i's network namespace.
func httpIn(i int) *http.Client {
	ns := NodeName(i)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return netnsutil.DialContext(ctx, ns, &net.Dialer{Timeout: 2 * time.Second}, network, addr)
	}
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // health endpoints only
}

// healthy waits for url (from node i) to answer 200, while the daemon tag runs.
func (c *Cluster) healthy(ctx context.Context, i int, tag, url string, d time.Duration) error {
	cl := httpIn(i)
	return waitFor(ctx, d, 100*time.Millisecond, tag+" healthy at "+url, func() (bool, error) {
		if !c.alive(tag) {
			return false, fmt.Errorf("exited: %s", c.logTail(tag))
		}
		resp, err := cl.Get(url)
		if err != nil {
			return false, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return false, fmt.Errorf("%s: %s", resp.Status, b)
		}
		return true, nil
	})
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	_ = os.MkdirAll(filepath.Join(c.Dir, "run"), 0o700)
	if err := c.start(1, "etcd", nil, c.Bin.Etcd, "--name", "prg-k8s", "--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		// Its data is on tmpfs (/run): fsync costs nothing there.
		"--initial-cluster", "prg-k8s=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381"); err != nil {
		return err
	}
	return c.healthy(ctx, 1, "etcd", "http://127.0.0.1:2379/health", 30*time.Second)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := c.pki.path
	if err := c.start(1, "kube-apiserver", nil, c.Bin.K("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379", "--advertise-address="+APIServer().String(), "--bind-address=0.0.0.0", "--secure-port=6443",
		"--service-cluster-ip-range="+ServiceCIDR.String(), "--client-ca-file="+p("ca.crt"),
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
		"--service-node-port-range=30000-32767",
		"--profiling=false", "--v=1"); err != nil {
		return err
	}
	return c.healthy(ctx, 1, "kube-apiserver", "https://"+APIServer().String()+":6443/readyz", 120*time.Second)
}

func (c *Cluster) startControllers(ctx context.Context) error {
	p := c.pki.path
	kc := p("controller-manager.kubeconfig")
	if err := c.start(1, "kube-controller-manager", nil, c.Bin.K("kube-controller-manager"),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"),
		"--cluster-signing-cert-file="+p("ca.crt"), "--cluster-signing-key-file="+p("ca.key"),
		"--use-service-account-credentials=true", "--leader-elect=false", "--bind-address=127.0.0.1",
		"--allocate-node-cidrs=true", "--cluster-cidr="+PodCIDR.String(), "--node-cidr-mask-size=24",
		"--service-cluster-ip-range="+ServiceCIDR.String(),
		// Endpoint changes reach kube-proxy at once (the default batches them for a second).
		"--concurrent-endpoint-syncs=5", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	ks := p("scheduler.kubeconfig")
	if err := c.start(1, "kube-scheduler", nil, c.Bin.K("kube-scheduler"), "--kubeconfig="+ks,
		"--authentication-kubeconfig="+ks, "--authorization-kubeconfig="+ks,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	return nil
}

// cniBinDir holds the CNI plugins the nodes use: links to the flannel plugin setup.sh built
// and to Debian's bridge, host-local, loopback and portmap.
func (c *Cluster) cniBinDir() (string, error) {
	d := filepath.Join(c.Dir, "cni-bin")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", err
	}
	links := map[string]string{"flannel": filepath.Join(c.Bin.FlannelCNI, "flannel")}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		links[p] = filepath.Join(c.Bin.PluginDir, p)
	}
	for n, t := range links {
		if err := os.Symlink(t, filepath.Join(d, n)); err != nil && !os.IsExist(err) {
			return "", err
		}
	}
	return d, nil
}

func (c *Cluster) sock(i int) string { return filepath.Join(c.nodeDir(i), "containerd.sock") }

// startContainerds starts every node's containerd and imports the images into each.
func (c *Cluster) startContainerds(ctx context.Context) error {
	cni, err := c.cniBinDir()
	if err != nil {
		return err
	}
	imgDir := filepath.Join(c.Dir, "images")
	if err := os.MkdirAll(imgDir, 0o700); err != nil {
		return err
	}
	var ims []image
	pi, err := pauseImage(c.Bin)
	if err != nil {
		return err
	}
	bi, err := busyboxImage(c.Bin)
	if err != nil {
		return err
	}
	ims = append(ims, pi, bi)
	var tars []string
	for _, im := range ims {
		f := filepath.Join(imgDir, strings.NewReplacer("/", "_", ":", "_").Replace(im.ref)+".tar")
		if err := writeArchiveFile(im, f); err != nil {
			return err
		}
		tars = append(tars, f)
	}
	for i := 1; i <= c.Spec.Nodes; i++ {
		d := c.nodeDir(i)
		for _, s := range []string{"root", "state", "cni-conf", "cni-data", "kubelet", "pod-logs", "flannel", "opt"} {
			if err := os.MkdirAll(filepath.Join(d, s), 0o755); err != nil {
				return err
			}
		}
		toml := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  disable_apparmor = true
  # The bounding set here lacks CAP_SYS_RESOURCE: nothing may lower oom_score_adj below 0, and
  # runc fails every sandbox (-998) without this clamp to containerd's own score.
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %[8]q
        Root = %[6]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[9]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.sock(i), filepath.Join(d, "opt"), PauseImage,
			filepath.Join(d, "state", "runc"), cni, c.Bin.Runc, filepath.Join(d, "cni-conf"))
		cfg := filepath.Join(d, "containerd.toml")
		if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
			return err
		}
		if err := c.start(i, fmt.Sprintf("containerd-n%d", i), nil, c.Bin.Containerd, "--config", cfg); err != nil {
			return err
		}
		if err := c.writeCNIConf(i); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, c.Spec.Nodes+1)
	for i := 1; i <= c.Spec.Nodes; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tag := fmt.Sprintf("containerd-n%d", i)
			if err := waitFor(ctx, 30*time.Second, 50*time.Millisecond, tag+" socket", func() (bool, error) {
				if !c.alive(tag) {
					return false, fmt.Errorf("exited: %s", c.logTail(tag))
				}
				_, err := os.Stat(c.sock(i))
				return err == nil, err
			}); err != nil {
				errs[i] = err
				return
			}
			errs[i] = c.importImages(ctx, i, tars...)
		}(i)
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func writeArchiveFile(im image, f string) error {
	out, err := os.Create(f + ".part")
	if err != nil {
		return err
	}
	if err := im.writeArchive(out); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(f+".part", f)
}

// importImages loads docker-archives into node i's containerd (the CRI's k8s.io namespace).
func (c *Cluster) importImages(ctx context.Context, i int, tars ...string) error {
	for _, t := range tars {
		out, err := exec.CommandContext(ctx, "ctr", "-a", c.sock(i), "-n", "k8s.io", "images", "import", "--no-unpack=false", t).CombinedOutput()
		if err != nil {
			return fmt.Errorf("import %s into %s's containerd: %w: %s", filepath.Base(t), NodeName(i), err, out)
		}
	}
	return nil
}

// writeCNIConf: the flannel meta plugin (it reads flanneld's subnet file) delegating to bridge
// and host-local, then portmap, all state under the node's directory.
func (c *Cluster) writeCNIConf(i int) error {
	d := c.nodeDir(i)
	conf := fmt.Sprintf(`{
  "name": "cbr0", "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "subnetFile": %q, "dataDir": %q,
     "ipam": {"type": "host-local", "dataDir": %q},
     "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, filepath.Join(d, "flannel", "subnet.env"), filepath.Join(d, "cni-data", "flannel"), filepath.Join(d, "cni-data", "networks"))
	return os.WriteFile(filepath.Join(d, "cni-conf", "10-flannel.conflist"), []byte(conf), 0o644)
}

func (c *Cluster) startKubelet(i int) error {
	d := c.nodeDir(i)
	y := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
podLogsDir: %q
volumePluginDir: %q
clusterDomain: cluster.local
failSwapOn: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
serializeImagePulls: false
resolvConf: /etc/resolv.conf
syncFrequency: 10s
nodeStatusUpdateFrequency: 4s
`, c.pki.path("ca.crt"), NodeName(i), c.sock(i), filepath.Join(d, "pod-logs"), filepath.Join(d, "volume-plugins"))
	cfg := filepath.Join(d, "kubelet.yaml")
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		return err
	}
	return c.start(i, fmt.Sprintf("kubelet-n%d", i), nil, c.Bin.K("kubelet"), "--config="+cfg,
		"--kubeconfig="+c.pki.path("kubelet-"+NodeName(i)+".kubeconfig"), "--root-dir="+filepath.Join(d, "kubelet"),
		// Its self-signed serving certificate goes to --cert-dir, /var/lib/kubelet/pki by
		// default whatever --root-dir says: on the host, where it outlived the lab.
		"--cert-dir="+filepath.Join(d, "kubelet", "pki"),
		"--hostname-override="+NodeName(i), "--node-ip="+nodeAddr(i).String(), "--v=1")
}

// startNodeNet starts node i's flanneld (once the node has its podCIDR), kube-proxy and
// kube-router.
func (c *Cluster) startNodeNet(ctx context.Context, i int) error {
	name := NodeName(i)
	if err := waitFor(ctx, 60*time.Second, 200*time.Millisecond, name+" registered with a podCIDR", func() (bool, error) {
		if !c.alive(fmt.Sprintf("kubelet-n%d", i)) {
			return false, fmt.Errorf("kubelet exited: %s", c.logTail(fmt.Sprintf("kubelet-n%d", i)))
		}
		out, err := c.Kubectl(ctx, "get", "node", name, "-o", "jsonpath={.spec.podCIDR}")
		if err != nil {
			return false, err
		}
		c.Nodes[i-1].PodCIDR = strings.TrimSpace(out)
		return c.Nodes[i-1].PodCIDR != "", nil
	}); err != nil {
		return err
	}
	d := c.nodeDir(i)
	netconf := filepath.Join(d, "flannel", "net-conf.json")
	if err := os.WriteFile(netconf, []byte(fmt.Sprintf(`{"Network": %q, "Backend": {"Type": "vxlan"}}`, PodCIDR.String())), 0o644); err != nil {
		return err
	}
	if err := c.start(i, fmt.Sprintf("flanneld-n%d", i), []string{"NODE_NAME=" + name}, c.Bin.Flanneld, "--kube-subnet-mgr",
		"--kubeconfig-file="+c.pki.path("flannel.kubeconfig"), "--iface="+UnderlayDev, "--ip-masq",
		"--net-config-path="+netconf, "--subnet-file="+filepath.Join(d, "flannel", "subnet.env")); err != nil {
		return err
	}
	if err := c.startKubeProxy(i); err != nil {
		return err
	}
	if c.Spec.NetworkPolicy {
		if err := c.start(i, fmt.Sprintf("kube-router-n%d", i), nil, c.Bin.KubeRouter,
			"--kubeconfig="+c.pki.path("kube-router.kubeconfig"), "--hostname-override="+name,
			"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
			"--iptables-sync-period=5m", "--ipvs-sync-period=5m", "--routes-sync-period=5m",
			"--health-port=0", "--metrics-port=0"); err != nil {
			return err
		}
	}
	return nil
}

// startKubeProxy writes node i's kube-proxy config for the cluster's proxy mode and starts it.
func (c *Cluster) startKubeProxy(i int) error {
	name, d := NodeName(i), c.nodeDir(i)
	kp := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
mode: %s
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {minSyncPeriod: 0s}
nftables: {minSyncPeriod: 0s}
nodePortAddresses: ["primary"]
`, c.pki.path("kube-proxy.kubeconfig"), c.Spec.ProxyMode, PodCIDR, name, nodeAddr(i))
	kpc := filepath.Join(d, "kube-proxy.yaml")
	if err := os.WriteFile(kpc, []byte(kp), 0o600); err != nil {
		return err
	}
	args := []string{c.Bin.K("kube-proxy"), "--config=" + kpc, "--v=1"}
	if c.Spec.ProxyMode == ProxyNFTables {
		args = append(args, "--feature-gates=NFTablesProxyMode=true")
	}
	return c.start(i, fmt.Sprintf("kube-proxy-n%d", i), nil, args...)
}

// SetProxyMode restarts every kube-proxy in mode (iptables or nftables), after `kube-proxy
// --cleanup` has removed the rules of the mode before, and waits until each is healthy.
func (c *Cluster) SetProxyMode(ctx context.Context, mode string) error {
	if mode != ProxyIPTables && mode != ProxyNFTables {
		return fmt.Errorf("proxy mode %q: want iptables or nftables", mode)
	}
	for i := 1; i <= c.Spec.Nodes; i++ {
		tag := fmt.Sprintf("kube-proxy-n%d", i)
		if err := stopPid(c.pidPath(tag), "kube-proxy", 5*time.Second); err != nil {
			return err
		}
		if out, err := nodeCommand(ctx, i, c.Bin.K("kube-proxy"), "--cleanup", "--config="+filepath.Join(c.nodeDir(i), "kube-proxy.yaml")).CombinedOutput(); err != nil {
			return fmt.Errorf("kube-proxy --cleanup on %s: %w: %s", NodeName(i), err, out)
		}
	}
	c.Spec.ProxyMode = mode
	for i := 1; i <= c.Spec.Nodes; i++ {
		if err := c.startKubeProxy(i); err != nil {
			return err
		}
	}
	for i := 1; i <= c.Spec.Nodes; i++ {
		if err := c.healthy(ctx, i, fmt.Sprintf("kube-proxy-n%d", i), "http://127.0.0.1:10256/healthz", 60*time.Second); err != nil {
			return err
		}
	}
	return c.save()
}

// waitNodesReady waits for every node Ready, its flanneld's subnet file and routes to every
// other node's subnet over flannel.1, and kube-proxy healthy.
func (c *Cluster) waitNodesReady(ctx context.Context) error {
	for i := 1; i <= c.Spec.Nodes; i++ {
		tag := fmt.Sprintf("flanneld-n%d", i)
		if err := waitFor(ctx, 60*time.Second, 100*time.Millisecond, NodeName(i)+"'s flannel lease", func() (bool, error) {
			if !c.alive(tag) {
				return false, fmt.Errorf("exited: %s", c.logTail(tag))
			}
			_, err := os.Stat(filepath.Join(c.nodeDir(i), "flannel", "subnet.env"))
			return err == nil, err
		}); err != nil {
			return err
		}
		if err := c.healthy(ctx, i, fmt.Sprintf("kube-proxy-n%d", i), "http://127.0.0.1:10256/healthz", 60*time.Second); err != nil {
			return err
		}
	}
	for i := 1; i <= c.Spec.Nodes; i++ {
		for j := 1; j <= c.Spec.Nodes; j++ {
			if i == j {
				continue
			}
			sub := c.Nodes[j-1].PodCIDR
			if err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, NodeName(i)+" routes "+sub+" over flannel.1", func() (bool, error) {
				out, _ := netnsutil.Run(ctx, NodeName(i), "ip", "-4", "route", "show", sub, "dev", "flannel.1")
				return strings.TrimSpace(out) != "", nil
			}); err != nil {
				return err
			}
		}
	}
	return waitFor(ctx, 90*time.Second, 250*time.Millisecond, "every node Ready", func() (bool, error) {
		out, err := c.Kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		if err != nil {
			return false, err
		}
		ready := strings.Count(out, "=True")
		if ready < c.Spec.Nodes {
			return false, fmt.Errorf("%s", strings.TrimSpace(out))
		}
		return true, nil
	})
}

// Kubectl runs kubectl as the cluster's admin (from node 1's namespaces) and returns stdout.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlIn(ctx, "", args...)
}

// KubectlIn is Kubectl with stdin.
func (c *Cluster) KubectlIn(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := c.KubectlCmd(ctx, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// KubectlCmd is the kubectl command line, to run with the caller's stdio.
func (c *Cluster) KubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	a := append([]string{"nsenter", "--net=" + netnsutil.Path(NodeName(1)), "--", c.Bin.K("kubectl"), "--kubeconfig=" + Kubeconfig()}, args...)
	return exec.CommandContext(ctx, a[0], a[1:]...)
}
