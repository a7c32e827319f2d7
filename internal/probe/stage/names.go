package stage

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// HostNetns is the NetnsName given to the namespace of the process that runs the probe.
const HostNetns = "host"

// DeviceInfo is what a (netns inode, ifindex) pair is called now.
type DeviceInfo struct {
	Netns string // named namespace, or HostNetns
	Name  string // device name
}

// ResolveDevices maps the devices of this process's namespace and of every named namespace
// (/var/run/netns) to their names, via netlink. Namespaces nobody named (a container runtime's,
// say) cannot be found this way; their devices keep the name the probe recorded. A namespace
// that fails is reported in the error while the others still resolve.
func ResolveDevices() (map[DevKey]DeviceInfo, error) {
	m := make(map[DevKey]DeviceInfo)
	var errs []error

	if err := resolveIn(m, HostNetns, "/proc/self/ns/net"); err != nil {
		errs = append(errs, err)
	}
	names, err := netnsutil.List("")
	if err != nil {
		errs = append(errs, fmt.Errorf("list named namespaces: %w", err))
	}
	for _, name := range names {
		if !netnsutil.Exists(name) { // stale file, or deleted while we scan
			continue
		}
		if err := resolveIn(m, name, netnsutil.Path(name)); err != nil {
			errs = append(errs, err)
		}
	}
	return m, errors.Join(errs...)
}

func resolveIn(m map[DevKey]DeviceInfo, name, path string) error {
	ino, err := netnsutil.Inode(path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in netns %s: %w", name, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("list links in netns %s: %w", name, err)
	}
	for _, l := range links {
		k := DevKey{Netns: ino, Ifindex: uint32(l.Attrs().Index)}
		if _, seen := m[k]; !seen { // a namespace mounted under two names: keep the first
			m[k] = DeviceInfo{Netns: name, Name: l.Attrs().Name}
		}
	}
	return nil
}

// Annotate sets Name and NetnsName of the snapshot's devices from m. Current netlink names win
// over the names the probe recorded when it first saw a device (devices get renamed, and an
// ifindex can be reused after a device is deleted).
func (s *Snapshot) Annotate(m map[DevKey]DeviceInfo) {
	for i := range s.Devices {
		d := &s.Devices[i]
		if info, ok := m[d.DevKey]; ok {
			d.Name, d.NetnsName = info.Name, info.Netns
		}
	}
}
