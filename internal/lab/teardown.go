package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// CleanupHook lets other layers (the datapath's pins and records) forget namespaces that a
// teardown removes. The datapath registers one; lab cannot import it without a cycle.
var CleanupHook func(namespaces []string, all bool) error

func listOurNamespaces() ([]string, error) { return netnsutil.List(Prefix) }

// Down removes a lab: its processes, namespaces (and with them every link inside) and records.
// It returns ErrNotUp (wrapped) if there was nothing to remove.
func Down(name string, log Logf) error {
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
	err = removeNamespaces(nss, false, log)
	return errors.Join(err, removeRecord(name))
}

// DownAll removes everything peregrine made that a crash could leave behind: every namespace
// with our prefix, every lab record, root-namespace links with our prefix, and (through the
// cleanup hook) every pinned object and datapath record.
func DownAll(log Logf) error {
	if log == nil {
		log = func(string, ...any) {}
	}
	nss, err := listOurNamespaces()
	if err != nil {
		return err
	}
	errs := []error{removeNamespaces(nss, true, log)}
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
	// Node agents' logs (agentproc: <mode>-agent-<pin dir>.log) of attachments to our namespaces.
	logs, _ := filepath.Glob(filepath.Join(StateDir, "*-agent-"+Prefix+"*.log"))
	for _, l := range logs {
		log("deleting %s", l)
		if err := os.Remove(l); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeNamespaces(nss []string, all bool, log Logf) error {
	var errs []error
	// Processes first: a namespace whose file is gone lives on while a process holds it.
	for _, ns := range nss {
		killIn(ns, log)
	}
	if CleanupHook != nil {
		errs = append(errs, CleanupHook(nss, all))
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
