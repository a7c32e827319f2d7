// Package pdsockmap is the socket-level shortcut that PipeDevice is measured against, as Cilium
// does it: a sockops program records the established TCP sockets of one cgroup (v2) in a
// sockhash, and an sk_msg program redirects each sendmsg of such a socket straight into its
// local peer's receive queue (bpf_msg_redirect_hash), skipping TCP/IP, the bridge and the veths.
// Only processes put into the shortcut's cgroup are affected, and only connections whose both
// ends are there.
package pdsockmap

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Shortcut is an attached instance: its cgroup, programs and maps.
type Shortcut struct {
	Cgroup string
	objs   smObjects
	ops    link.Link
}

// Cgroup2Root finds the cgroup v2 hierarchy (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
// hybrid machine).
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 3 && fs[2] == "cgroup2" {
			return fs[1], nil
		}
	}
	return "", errors.New("no cgroup v2 hierarchy mounted (sockops needs one: mount -t cgroup2 none /sys/fs/cgroup/unified)")
}

// Attach creates cgroup name under the cgroup v2 root and attaches the programs to it.
func Attach(name string) (*Shortcut, error) {
	root, err := Cgroup2Root()
	if err != nil {
		return nil, err
	}
	cg := filepath.Join(root, name)
	if err := os.Mkdir(cg, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("cgroup %s: %w", cg, err)
	}
	s := &Shortcut{Cgroup: cg}
	if err := loadSmObjects(&s.objs, nil); err != nil {
		s.Close()
		return nil, fmt.Errorf("load sockmap programs: %w", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: s.objs.PrgPdSocks.FD(), Program: s.objs.PrgPdSkmsg, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		s.Close()
		return nil, fmt.Errorf("attach sk_msg to the sockhash: %w", err)
	}
	s.ops, err = link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: s.objs.PrgPdSockops})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("attach sockops to %s: %w", cg, err)
	}
	return s, nil
}

// Enter moves process pid (all its threads) into the shortcut's cgroup; sockets it creates
// afterwards are shortcut candidates.
func (s *Shortcut) Enter(pid int) error {
	return os.WriteFile(filepath.Join(s.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// Stats: sockets recorded, messages redirected, messages passed to the stack.
func (s *Shortcut) Stats() (recorded, redirected, passed uint64, err error) {
	var out [3]uint64
	for i := uint32(0); i < 3; i++ {
		var per []uint64
		if err := s.objs.PrgPdStats.Lookup(i, &per); err != nil {
			return 0, 0, 0, err
		}
		for _, v := range per {
			out[i] += v
		}
	}
	return out[0], out[1], out[2], nil
}

// Close detaches everything, moves any process left in the cgroup back to the root, and removes
// the cgroup.
func (s *Shortcut) Close() error {
	if s.ops != nil {
		s.ops.Close()
	}
	if s.objs.PrgPdSkmsg != nil && s.objs.PrgPdSocks != nil {
		link.RawDetachProgram(link.RawDetachProgramOptions{Target: s.objs.PrgPdSocks.FD(), Program: s.objs.PrgPdSkmsg, Attach: ebpf.AttachSkMsgVerdict})
	}
	s.objs.Close()
	if b, err := os.ReadFile(filepath.Join(s.Cgroup, "cgroup.procs")); err == nil {
		parent := filepath.Join(filepath.Dir(s.Cgroup), "cgroup.procs")
		for _, p := range strings.Fields(string(b)) {
			os.WriteFile(parent, []byte(p), 0o644)
		}
	}
	return os.Remove(s.Cgroup)
}
