// Package bpfobj is what every datapath mode does with its bpf2go objects: load them (with a
// readable verifier error), pin them by their kernel names, re-open the pins from another
// process, attach programs with tcx and pin the links, detach pinned links, and refuse to attach
// over pins that already exist. Modes use bpf2go's generated structs (xxxObjects, xxxMaps,
// xxxPrograms) directly: the `ebpf:"name"` tags bpf2go writes are the pin names.
package bpfobj

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// LinksSub is the sub-directory of a mode's pin directory that holds its tcx link pins.
const LinksSub = "links"

// Load loads a collection spec into objs (a pointer to a bpf2go objects, maps or programs
// struct), after lifting the memlock limit. who prefixes the errors ("falcon").
func Load(who string, spec *ebpf.CollectionSpec, objs any, opts *ebpf.CollectionOptions) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("%s: raise memlock limit: %w", who, err)
	}
	if err := spec.LoadAndAssign(objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return fmt.Errorf("%s: the verifier rejected a program: %+v", who, verr)
		}
		return fmt.Errorf("%s: load eBPF objects (needs Linux 6.6+ with BTF for tcx and kfuncs): %w", who, err)
	}
	return nil
}

// New loads a bpf2go objects struct T from bpf2go's spec loader (loadXxx): Load into a new T.
func New[T any](who string, loadSpec func() (*ebpf.CollectionSpec, error), opts *ebpf.CollectionOptions) (*T, error) {
	spec, err := loadSpec()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	var o T
	if err := Load(who, spec, &o, opts); err != nil {
		return nil, err
	}
	return &o, nil
}

// Open is OpenPinned into a new T.
func Open[T any](who, dir string, progs bool) (*T, error) {
	var o T
	if err := OpenPinned(who, dir, &o, progs); err != nil {
		return nil, err
	}
	return &o, nil
}

// field is one *ebpf.Map or *ebpf.Program of a bpf2go struct with its kernel name.
type field struct {
	name string
	v    reflect.Value // addressable *ebpf.Map or *ebpf.Program
}

var (
	mapType  = reflect.TypeOf((*ebpf.Map)(nil))
	progType = reflect.TypeOf((*ebpf.Program)(nil))
)

// fields walks objs (a pointer to a struct, embedded structs followed) for tagged maps and
// programs.
func fields(objs any) []field {
	var out []field
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			f, sf := v.Field(i), v.Type().Field(i)
			switch {
			case sf.Anonymous && f.Kind() == reflect.Struct:
				walk(f)
			case (f.Type() == mapType || f.Type() == progType) && sf.Tag.Get("ebpf") != "":
				out = append(out, field{sf.Tag.Get("ebpf"), f})
			}
		}
	}
	walk(reflect.ValueOf(objs).Elem())
	return out
}

// Pin pins every loaded map and program of objs under dir by its kernel name (what bpftool
// shows), skipping those listed in except; dir is created.
func Pin(who, dir string, objs any, except ...string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s: create pin directory (is bpffs mounted on /sys/fs/bpf?): %w", who, err)
	}
	for _, f := range fields(objs) {
		if f.v.IsNil() || contains(except, f.name) {
			continue
		}
		var err error
		switch o := f.v.Interface().(type) {
		case *ebpf.Map:
			err = o.Pin(filepath.Join(dir, f.name))
		case *ebpf.Program:
			err = o.Pin(filepath.Join(dir, f.name))
		}
		if err != nil {
			return fmt.Errorf("%s: pin %s: %w", who, f.name, err)
		}
	}
	return nil
}

// OpenPinned fills objs from the pins under dir: every map, and the programs too when progs is
// set. On error whatever was opened is closed.
func OpenPinned(who, dir string, objs any, progs bool) error {
	var opened []interface{ Close() error }
	for _, f := range fields(objs) {
		p := filepath.Join(dir, f.name)
		var err error
		switch f.v.Type() {
		case mapType:
			var m *ebpf.Map
			if m, err = ebpf.LoadPinnedMap(p, nil); err == nil {
				f.v.Set(reflect.ValueOf(m))
				opened = append(opened, m)
			}
		case progType:
			if !progs {
				continue
			}
			var pr *ebpf.Program
			if pr, err = ebpf.LoadPinnedProgram(p, nil); err == nil {
				f.v.Set(reflect.ValueOf(pr))
				opened = append(opened, pr)
			}
		}
		if err != nil {
			for _, o := range opened {
				o.Close()
			}
			return fmt.Errorf("%s: open pinned %s (is it attached?): %w", who, f.name, err)
		}
	}
	return nil
}

// LinkPin names the pin of a device's tcx link under a mode's pin directory: the namespace
// inode and ifindex make it unique, the device name makes it readable.
func LinkPin(dir string, netnsInode uint64, ifindex int, dev, suffix string) string {
	name := fmt.Sprintf("%d_%d_%s", netnsInode, ifindex, Sanitize(dev))
	if suffix != "" {
		name += "_" + suffix
	}
	return filepath.Join(dir, LinksSub, name)
}

// Sanitize makes a device or namespace name usable as one path element.
func Sanitize(s string) string { return strings.NewReplacer("/", "_", ".", "_", " ", "_").Replace(s) }

// AttachTCX attaches prog to device ifindex of namespace netns (ingress, or egress) and pins the
// link at pin, so it outlives this process. Programs already there stay (tcx appends).
func AttachTCX(prog *ebpf.Program, netns string, ifindex int, egress bool, pin string) error {
	ns, err := netnsutil.Open(netns)
	if err != nil {
		return fmt.Errorf("attach tcx: %w", err)
	}
	defer ns.Close()
	return AttachTCXIn(prog, ns, ifindex, egress, pin)
}

// AttachTCXIn is AttachTCX in a namespace already open (one that is entered several times).
func AttachTCXIn(prog *ebpf.Program, ns *netnsutil.NS, ifindex int, egress bool, pin string) error {
	if prog == nil {
		return errors.New("attach tcx: no program (objects opened without their programs)")
	}
	at := ebpf.AttachTCXIngress
	if egress {
		at = ebpf.AttachTCXEgress
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return fmt.Errorf("create pin directory (is bpffs mounted on /sys/fs/bpf?): %w", err)
	}
	var l link.Link
	err := ns.Do(func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
		return err
	})
	if err != nil {
		return fmt.Errorf("attach tcx: %w (tcx needs Linux 6.6+)", err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin link: %w", err)
	}
	return nil
}

// DetachPin detaches a pinned link at once and removes the pin; a missing pin is not an error.
// Unpinning alone also detaches, but only when the kernel frees the link, which it defers (RCU,
// then a work item): a check of the device right after would still see the program. Links
// without a detach operation (tracing) just go with the unpin.
func DetachPin(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	derr := l.Detach()
	l.Close()
	if derr != nil && !errors.Is(derr, ebpf.ErrNotSupported) {
		return fmt.Errorf("detach %s: %w", pin, derr)
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", pin, err)
	}
	return nil
}

// LinkAlive tells whether the pinned tcx link at pin still holds its device: a link detached by
// hand (`bpftool link detach`) keeps its pin but no device; one unpinned by hand is gone.
func LinkAlive(pin string) bool {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return false
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return false
	}
	return info.TCX() == nil || info.TCX().Ifindex != 0
}

// LinkPins lists the link pins under a mode's pin directory (those a crash left out of a record
// included).
func LinkPins(dir string) []string {
	entries, _ := os.ReadDir(filepath.Join(dir, LinksSub))
	var out []string
	for _, e := range entries {
		out = append(out, filepath.Join(dir, LinksSub, e.Name()))
	}
	return out
}

// CheckNoPins refuses to attach when a mode's pin directory already holds something: another
// attachment (or its agent) owns it, or a crashed attach nobody detached left it.
func CheckNoPins(who, dir string) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s: pinned objects already exist at %s (another peregrine attachment or its agent holds them): run `peregrine detach` for this node, or remove that directory if nothing is attached", who, dir)
	}
	return nil
}

// ProgramsOn lists the tcx programs on a device whose name starts with prefix ("prg_falcon"),
// as "name (id N)". A kernel without tcx lists none (attach will say so).
func ProgramsOn(netns string, ifindex int, egress bool, prefix string) []string {
	at := ebpf.AttachTCXIngress
	if egress {
		at = ebpf.AttachTCXEgress
	}
	var names []string
	_ = netnsutil.Do(netns, func() error {
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
		if err != nil {
			return err
		}
		for _, p := range res.Programs {
			prog, err := ebpf.NewProgramFromID(p.ID)
			if err != nil {
				continue
			}
			if info, err := prog.Info(); err == nil && strings.HasPrefix(info.Name, prefix) {
				names = append(names, fmt.Sprintf("%s (id %d)", info.Name, p.ID))
			}
			prog.Close()
		}
		return nil
	})
	return names
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
