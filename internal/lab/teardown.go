package lab

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/lab/realflannel"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Forget is told which namespaces a teardown removes, after their processes are stopped and
// before the namespaces go; all says that everything peregrine made goes. The caller passes the
// datapath's cleanup (datapath.ForgetNamespaces), so that the records, pins and agents of
// attachments there go too: the lab itself knows nothing of the datapath. nil forgets nothing
// (a lab nothing was attached to).
type Forget func(namespaces []string, all bool) error

func listOurNamespaces() ([]string, error) { return netnsutil.List(Prefix) }

// Down removes a lab: its processes, namespaces (and with them every link inside) and records,
// telling forget first. It returns ErrNotUp (wrapped) if there was nothing to remove.
func Down(name string, log Logf, forget Forget) error {
	if log == nil {
		log = func(string, ...any) {}
	}
	nss, err := netnsutil.List(NsPrefix(name))
	if err != nil {
		return err
	}
	_, recErr := readRecord(name)
	if len(nss) == 0 && recErr != nil {
		return fmt.Errorf("lab %q: %w: nothing to remove", name, ErrNotUp)
	}
	err = removeNamespaces(nss, false, log, forget)
	return errors.Join(err, removeRecord(name))
}

// DownAll removes everything peregrine made that a crash could leave behind: every namespace
// with our prefix, every lab record, root-namespace links with our prefix, and (through forget)
// every pinned object and datapath record. first are the teardowns of labs that live in
// packages importing this one (the k8s cluster: its mounts, cgroups and sysctls), which the
// caller passes because this package cannot call them: each runs before the namespace sweep
// would pull the namespaces from under their daemons.
func DownAll(log Logf, forget Forget, first ...func(Logf) error) error {
	if log == nil {
		log = func(string, ...any) {}
	}
	// Real flannel labs first: their own down also stops etcd and flanneld by pid file and
	// removes their state directories and CNI state, which the namespace sweep would not.
	// Likewise the labs the caller names in first.
	rfErr := realflannel.DownAll(log)
	for _, f := range first {
		rfErr = errors.Join(rfErr, f(log))
	}
	nss, err := listOurNamespaces()
	if err != nil {
		return err
	}
	errs := []error{rfErr, removeNamespaces(nss, true, log, forget)}
	if links, err := netlink.LinkList(); err == nil {
		for _, lk := range links {
			if strings.HasPrefix(lk.Attrs().Name, Prefix) {
				log("deleting link %s", lk.Attrs().Name)
				errs = append(errs, netlink.LinkDel(lk))
			}
		}
	}
	for _, n := range Names() {
		errs = append(errs, removeRecord(n))
	}
	return errors.Join(errs...)
}

func removeNamespaces(nss []string, all bool, log Logf, forget Forget) error {
	var errs []error
	// Processes first: a namespace whose file is gone lives on while a process holds it.
	for _, ns := range nss {
		killIn(ns, log)
	}
	if forget != nil {
		errs = append(errs, forget(nss, all))
	}
	for _, ns := range nss {
		log("deleting namespace %s", ns)
		if err := netnsutil.Delete(ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killIn terminates every process in the namespace: SIGTERM, a grace period, then SIGKILL.
func killIn(ns string, log Logf) {
	ino, err := netnsutil.Inode(netnsutil.Path(ns))
	if err != nil {
		return
	}
	pids := netnsutil.PIDsIn(ino)
	if len(pids) == 0 {
		return
	}
	log("stopping %d process(es) in %s", len(pids), ns)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && len(netnsutil.PIDsIn(ino)) > 0 {
		time.Sleep(50 * time.Millisecond)
	}
	for _, p := range netnsutil.PIDsIn(ino) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	// Reap is not ours to do (they are not our children); give the kernel a moment.
	for i := 0; i < 20 && len(netnsutil.PIDsIn(ino)) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
}
