package k8s

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/proc"
)

// Down removes the cluster: every daemon (by pid file), every container (by cgroup), every
// process left in a node's namespaces, the nodes' mount namespaces (with every mount kubelet
// and containerd made in them), the network namespaces, the cgroups, the state directory, and
// it writes back the global sysctls kubelet changed. forget (the datapath's cleanup, as
// lab.Down is given it; nil forgets nothing) is told the nodes' namespaces once nothing runs in
// them any more and before they go, so that attachments to the nodes lose their records, pins
// and agents too: a bench killed with -9 leaves none behind. Nothing up is not an error;
// something left behind is.
func Down(log func(string, ...any), forget lab.Forget) error {
	if log == nil {
		log = func(string, ...any) {}
	}
	_, serr := os.Stat(StateRoot)
	nss, _ := netnsutil.List(Prefix)
	if errors.Is(serr, os.ErrNotExist) && len(nss) == 0 && len(cgroupProcs()) == 0 && !cgroupsLeft() {
		return nil
	}
	log("removing the k8s lab")
	var errs []error
	run := filepath.Join(StateRoot, "run")
	// Daemons first, kubelet before everything (it would restart what is killed), the
	// apiserver last (it takes longest to stop and nothing needs it any more).
	order := []string{"kubelet", "kube-proxy", "kube-router", "flanneld", "kube-scheduler", "kube-controller-manager"}
	pidFiles, _ := filepath.Glob(filepath.Join(run, "*.pid"))
	sort.Strings(pidFiles)
	stopped := map[string]bool{}
	for _, o := range order {
		for _, f := range pidFiles {
			tag := strings.TrimSuffix(filepath.Base(f), ".pid")
			if strings.HasPrefix(tag, o) && !stopped[f] {
				stopped[f] = true
				errs = append(errs, stopPid(f, o, 5*time.Second))
			}
		}
	}
	// The pods' containers: everything in the nodes' cgroup subtrees (SIGKILL, until empty:
	// a shim may still be starting one).
	for k := 0; k < 20; k++ {
		ps := cgroupProcs()
		if len(ps) == 0 {
			break
		}
		proc.KillAll(ps)
	}
	for _, f := range pidFiles {
		tag := strings.TrimSuffix(filepath.Base(f), ".pid")
		if strings.HasPrefix(tag, "containerd") && !stopped[f] {
			stopped[f] = true
			errs = append(errs, stopPid(f, "containerd", 5*time.Second))
		}
	}
	for _, f := range pidFiles {
		if !stopped[f] {
			tag := strings.TrimSuffix(filepath.Base(f), ".pid")
			prog := tag
			if tag == "etcd" {
				prog = "etcd"
			}
			errs = append(errs, stopPid(f, prog, 10*time.Second))
		}
	}
	// Whatever is left in the nodes' namespaces: shims, a daemon whose pid file was lost.
	mnts, _ := filepath.Glob(filepath.Join(StateRoot, "mnt", "n*"))
	for _, m := range mnts {
		proc.KillAll(pidsInMountNS(m))
	}
	for _, ns := range nss {
		if ino, err := netnsutil.Inode(netnsutil.Path(ns)); err == nil {
			proc.KillAll(netnsutil.PIDsIn(ino))
		}
	}
	if forget != nil && len(nss) > 0 {
		errs = append(errs, forget(nss, false))
	}
	// The mount namespaces go with their last reference: their files' bind mounts.
	for _, m := range mnts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	// Anything under the state directory still mounted in the host's namespace (the
	// private mount the namespace files live on), deepest first.
	ms := mounts()
	sort.Sort(sort.Reverse(sort.StringSlice(ms)))
	for _, m := range ms {
		if m == StateRoot || strings.HasPrefix(m, StateRoot+"/") {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	for _, ns := range nss {
		log("deleting namespace %s", ns)
		if err := netnsutil.Delete(ns); err != nil {
			errs = append(errs, err)
		}
	}
	// cgroups: once empty (a killed process leaves its cgroup a moment later).
	var cerr error
	for k := 0; k < 50; k++ {
		if cerr = removeCgroups(); cerr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	errs = append(errs, cerr, restoreSysctls())
	for i := len(madeMountPoints) - 1; i >= 0; i-- {
		d := madeMountPoints[i]
		marker := filepath.Join(StateRoot, "made"+strings.ReplaceAll(d, "/", "_"))
		if _, err := os.Stat(marker); err == nil {
			_ = os.Remove(d) // only if still empty: someone else may use it by now
		}
	}
	if err := os.RemoveAll(StateRoot); err != nil {
		errs = append(errs, err)
	}
	if left, _ := netnsutil.List(Prefix); len(left) > 0 {
		errs = append(errs, fmt.Errorf("namespaces left: %s", strings.Join(left, " ")))
	}
	return errors.Join(errs...)
}

func cgroupsLeft() bool {
	for _, h := range cgroupHierarchies() {
		if m, _ := filepath.Glob(filepath.Join(h, Prefix+"n*")); len(m) > 0 {
			return true
		}
	}
	return false
}
