// Package realflannel brings up flannel itself, not an imitation: one etcd as the subnet store,
// flanneld (VXLAN backend) in every node namespace, and pods made by CNI ADD through the flannel
// CNI plugin, which delegates to the bridge and host-local plugins. peregrine's tests and
// benchmarks attach to it to meet a real CNI's overlay; scripts/real-flannel.sh drives it by hand
// (`peregrine lab real-flannel up|down`).
//
// Everything it makes is named prg-<name>-*: the namespaces, and its run-time state under
// /run/peregrine/realflannel/<name> (pid files, etcd's data, subnet files, CNI state). Down
// removes all of it, also after a crash, from what it finds on disk.
package realflannel

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Pinned versions, built once by scripts/setup.sh from the Go module proxy and cached by
// version (the script holds the same strings; TestSetupScriptAgrees keeps them in step).
const (
	FlannelVersion    = "v0.28.10" // github.com/flannel-io/flannel (flanneld)
	CNIPluginsVersion = "v0.9.1"   // github.com/containernetworking/plugins (the flannel meta plugin)
	CNIToolVersion    = "v1.3.1"   // github.com/containernetworking/cni (cnitool)
	CacheDir          = "/var/cache/peregrine"
	// DebianCNIDir holds Debian's containernetworking-plugins (bridge, host-local).
	DebianCNIDir = "/usr/lib/cni"
)

// Binaries says where each program the lab runs is.
type Binaries struct {
	Flanneld   string
	FlannelCNI string // the directory holding the flannel plugin (first on CNI_PATH)
	CNITool    string
	Etcd       string
	PluginDir  string // bridge and host-local
}

// DefaultBinaries are the paths setup.sh installs to.
func DefaultBinaries() Binaries {
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		etcd = "/usr/bin/etcd"
	}
	return Binaries{
		Flanneld:   filepath.Join(CacheDir, "flanneld-"+FlannelVersion, "flanneld"),
		FlannelCNI: filepath.Join(CacheDir, "cni-plugins-"+CNIPluginsVersion),
		CNITool:    filepath.Join(CacheDir, "cnitool-"+CNIToolVersion, "cnitool"),
		Etcd:       etcd,
		PluginDir:  DebianCNIDir,
	}
}

// Missing lists the programs that are not installed, each with what provides it; empty when
// the lab can run.
func (b Binaries) Missing() []string {
	var out []string
	for _, c := range []struct{ path, what string }{
		{b.Flanneld, "flanneld " + FlannelVersion + " (scripts/setup.sh builds it)"},
		{filepath.Join(b.FlannelCNI, "flannel"), "flannel CNI plugin " + CNIPluginsVersion + " (scripts/setup.sh builds it)"},
		{b.CNITool, "cnitool " + CNIToolVersion + " (scripts/setup.sh builds it)"},
		{b.Etcd, "etcd (Debian's etcd-server)"},
		{filepath.Join(b.PluginDir, "bridge"), "CNI bridge plugin (Debian's containernetworking-plugins)"},
		{filepath.Join(b.PluginDir, "host-local"), "CNI host-local plugin (Debian's containernetworking-plugins)"},
	} {
		if st, err := os.Stat(c.path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			out = append(out, fmt.Sprintf("%s: %s", c.path, c.what))
		}
	}
	return out
}
