package k8s

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// httpGetIn sends GET / to addr from namespace ns and returns the body, trimmed.
func httpGetIn(ns, addr string) (string, error) {
	conn, err := dialIn(ns, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		return "", fmt.Errorf("no HTTP answer from %s: %q", addr, b)
	}
	return strings.TrimSpace(body), nil
}

// dialIn connects from namespace ns (a name or a path); the socket stays in that namespace.
func dialIn(ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := netnsutil.Do(ns, func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 3*time.Second)
		return err
	})
	return c, err
}

func listenIn(ns, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := netnsutil.Do(ns, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

func listenPacketIn(ns, network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := netnsutil.Do(ns, func() error {
		var err error
		l, err = net.ListenPacket(network, addr)
		return err
	})
	return l, err
}

// snapshot is what of the machine the cluster may touch and must leave as it found it.
type snapshot struct {
	sysctls map[string]string
	cgroups map[string]bool // top-level cgroup directories of every hierarchy
	mounts  map[string]bool
	netns   map[string]bool
	varlog  []string // /var/log/containers (nil: absent)
	dirs    map[string]bool
}

func takeSnapshot() *snapshot {
	s := &snapshot{sysctls: map[string]string{}, cgroups: map[string]bool{}, mounts: map[string]bool{}, netns: map[string]bool{}, dirs: map[string]bool{}}
	for _, k := range globalSysctls {
		if b, err := os.ReadFile(sysctlPath(k)); err == nil {
			s.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	for _, h := range cgroupHierarchies() {
		ents, _ := os.ReadDir(h)
		for _, e := range ents {
			if e.IsDir() {
				s.cgroups[filepath.Join(h, e.Name())] = true
			}
		}
	}
	f, _ := os.Open("/proc/self/mountinfo")
	if f != nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fs := strings.Fields(sc.Text()); len(fs) > 4 {
				s.mounts[fs[4]] = true
			}
		}
		f.Close()
	}
	ents, _ := os.ReadDir(netnsutil.RunDir)
	for _, e := range ents {
		s.netns[e.Name()] = true
	}
	if ents, err := os.ReadDir("/var/log/containers"); err == nil {
		s.varlog = []string{}
		for _, e := range ents {
			s.varlog = append(s.varlog, e.Name())
		}
	}
	for _, d := range []string{"/run/netns", "/run/peregrine", "/var/log/containers", "/var/log/pods", "/var/lib/kubelet", "/etc/cni/net.d", "/var/lib/cni", StateRoot} {
		if _, err := os.Stat(d); err == nil {
			s.dirs[d] = true
		}
	}
	return s
}

// ours says whether a name made by another helper's lab (prg-<other>-...) may come and go
// while the tests run: only the k8s lab's own names must be back as they were.
func othersLab(name string) bool {
	return strings.HasPrefix(name, "prg-") && !strings.HasPrefix(name, Prefix)
}

// diff lists what differs from an earlier snapshot, ignoring other labs' namespaces and mounts.
func (s *snapshot) diff(old *snapshot) []string {
	var out []string
	for k, v := range old.sysctls {
		if s.sysctls[k] != v {
			out = append(out, fmt.Sprintf("sysctl %s: %s, was %s", k, s.sysctls[k], v))
		}
	}
	for c := range s.cgroups {
		if !old.cgroups[c] {
			out = append(out, "cgroup left: "+c)
		}
	}
	for m := range s.mounts {
		if !old.mounts[m] && !othersLab(filepath.Base(m)) {
			out = append(out, "mount left: "+m)
		}
	}
	for n := range s.netns {
		if !old.netns[n] && !othersLab(n) {
			out = append(out, "/run/netns entry left: "+n)
		}
	}
	if (s.varlog == nil) != (old.varlog == nil) || len(s.varlog) != len(old.varlog) {
		out = append(out, fmt.Sprintf("/var/log/containers: %v, was %v", s.varlog, old.varlog))
	}
	for d := range s.dirs {
		if !old.dirs[d] {
			out = append(out, "directory left: "+d)
		}
	}
	for d := range old.dirs {
		if !s.dirs[d] {
			out = append(out, "directory removed: "+d)
		}
	}
	// Processes: nothing of the cluster's may run on.
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, StateRoot) || strings.HasPrefix(argv0, CacheDir+"/k8s-") || strings.HasPrefix(argv0, CacheDir+"/kube-router-") {
			out = append(out, fmt.Sprintf("process left: %s %s", e.Name(), cmd))
		}
	}
	sort.Strings(out)
	return out
}
