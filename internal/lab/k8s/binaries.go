package k8s

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/peregrine-net/peregrine/internal/lab/realflannel"
)

// Pinned versions, built once by scripts/setup-k8s.sh from the Go module proxy and cached by
// version (the script holds the same strings; TestSetupScriptAgrees keeps them in step).
// flanneld and the flannel CNI plugin are the real flannel lab's (scripts/setup.sh).
const (
	KubernetesVersion = "v1.31.14" // k8s.io/kubernetes
	KubeRouterVersion = "v2.1.0"   // github.com/cloudnativelabs/kube-router (its NetworkPolicy controller)
	PauseVersion      = "3.10"     // the sandbox image's tag (registry.k8s.io/pause)
	CacheDir          = realflannel.CacheDir
)

// Binaries says where each program the cluster runs is.
type Binaries struct {
	Kube       string // kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
	KubeRouter string
	Pause      string
	Flanneld   string
	FlannelCNI string // the directory holding the flannel CNI plugin
	PluginDir  string // bridge, host-local, loopback, portmap (Debian's containernetworking-plugins)
	Etcd       string
	Containerd string
	Runc       string
	Busybox    string
}

// DefaultBinaries are the paths setup.sh and setup-k8s.sh install to.
func DefaultBinaries() Binaries {
	rf := realflannel.DefaultBinaries()
	look := func(name, def string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		return def
	}
	return Binaries{
		Kube:       filepath.Join(CacheDir, "k8s-"+KubernetesVersion),
		KubeRouter: filepath.Join(CacheDir, "kube-router-"+KubeRouterVersion, "kube-router"),
		Pause:      filepath.Join(CacheDir, "pause-"+PauseVersion, "pause"),
		Flanneld:   rf.Flanneld,
		FlannelCNI: rf.FlannelCNI,
		PluginDir:  rf.PluginDir,
		Etcd:       rf.Etcd,
		Containerd: look("containerd", "/usr/bin/containerd"),
		Runc:       look("runc", "/usr/sbin/runc"),
		Busybox:    "/bin/busybox",
	}
}

// Kubernetes programs the cluster runs, all in Binaries.Kube.
var kubePrograms = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}

// K is the path of one Kubernetes program.
func (b Binaries) K(prog string) string { return filepath.Join(b.Kube, prog) }

// Missing lists the programs that are not installed, each with what provides it; empty when
// the cluster can run.
func (b Binaries) Missing() []string {
	type c struct{ path, what string }
	var cs []c
	for _, p := range kubePrograms {
		cs = append(cs, c{b.K(p), p + " " + KubernetesVersion + " (scripts/setup-k8s.sh builds it)"})
	}
	cs = append(cs,
		c{b.KubeRouter, "kube-router " + KubeRouterVersion + " (scripts/setup-k8s.sh builds it)"},
		c{b.Pause, "pause " + PauseVersion + " (scripts/setup-k8s.sh builds it)"},
		c{b.Flanneld, "flanneld " + realflannel.FlannelVersion + " (scripts/setup.sh builds it)"},
		c{filepath.Join(b.FlannelCNI, "flannel"), "flannel CNI plugin (scripts/setup.sh builds it)"},
		c{b.Etcd, "etcd (Debian's etcd-server)"},
		c{b.Containerd, "containerd (Debian's containerd)"},
		c{b.Runc, "runc (Debian's runc)"},
		c{b.Busybox, "busybox (Debian's busybox-static)"},
	)
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		cs = append(cs, c{filepath.Join(b.PluginDir, p), "CNI " + p + " plugin (Debian's containernetworking-plugins)"})
	}
	for _, p := range []string{"ipset", "nsenter", "unshare", "iptables"} {
		if _, err := exec.LookPath(p); err != nil {
			cs = append(cs, c{p, p + " (not on PATH)"})
		}
	}
	var out []string
	for _, x := range cs {
		if !filepath.IsAbs(x.path) {
			out = append(out, x.what)
			continue
		}
		if st, err := os.Stat(x.path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			out = append(out, fmt.Sprintf("%s: %s", x.path, x.what))
		}
	}
	return out
}
