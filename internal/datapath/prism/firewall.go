package prism

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"strings"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The firewall gate (bpf/prism_gate.h, accepted): an HP frame is redirected past the normal path
// only when conntrack in the VXLAN device's namespace confirmed the flow (TCP: reply seen) and
// prg_prism_fwd, at the end of that namespace's FORWARD hook, saw one of the flow's frames within
// the window. This file puts prg_prism_fwd on each such namespace and, unless told not to, keeps
// conntrack on there.

// fwPriority puts prg_prism_fwd after every FORWARD chain a firewall uses (filter is 0, nftables
// chains up to 2^31-2); the kernel reserves NF_IP_PRI_LAST itself.
const fwPriority = math.MaxInt32 - 1

// ctTable is prism's nftables table: one regular chain (no hook, so no packet ever runs it) with
// a rule on ct state. The rule alone makes the kernel track connections in the namespace
// (nf_ct_netns_get), so the gate has entries to read where nothing else uses conntrack; where
// something does, it only adds a reference. Detach deletes the table.
const ctTable = "prg_prism"

// fwNS is one namespace the gate serves, as recorded.
type fwNS struct {
	Netns string   `json:"netns"`
	Inode uint32   `json:"netns_inode"`
	Pins  []string `json:"link_pins"`
	// Conntrack: prism added ctTable here (removed on detach).
	Conntrack bool `json:"conntrack,omitempty"`
}

// defaultVerify is how often one frame of an HP flow takes the normal path to re-verify it; the
// window is windowFactor times that (two re-verifications may be lost in the network).
const (
	defaultVerify = 100 * time.Millisecond
	windowFactor  = 3
)

// writeGate stores the re-verification interval and window in the config word the rules share.
func (o *objects) writeGate(verify time.Duration) error {
	var cfg prsPrismCfg
	if err := o.PrgPrismCfg.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("prism: read config: %w", err)
	}
	cfg.VerifyNs = uint64(verify)
	cfg.WindowNs = uint64(verify * windowFactor)
	if err := o.PrgPrismCfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("prism: write config: %w", err)
	}
	return nil
}

// followFirewall puts prg_prism_fwd (IPv4 and IPv6) on every namespace of vxs not yet in have,
// and with conntrack ctTable; it returns have plus the new namespaces (recorded as far as they
// got, so detach finds a half-done one).
func followFirewall(o *objects, target string, vxs []vxlanDev, have []fwNS, conntrack bool) ([]fwNS, error) {
	seen := map[uint32]bool{}
	for _, f := range have {
		seen[f.Inode] = true
	}
	var errs []error
	for _, vx := range vxs {
		if seen[vx.Inode] {
			continue
		}
		seen[vx.Inode] = true
		f := fwNS{Netns: vx.Dev.Netns, Inode: vx.Inode}
		err := attachFwd(o, target, &f)
		if err == nil && conntrack {
			if err = addCtTable(f.Netns); err == nil {
				f.Conntrack = true
			}
		}
		have = append(have, f)
		errs = append(errs, err)
	}
	return have, errors.Join(errs...)
}

func attachFwd(o *objects, target string, f *fwNS) error {
	if o.PrgPrismFwd == nil {
		return errors.New("prism: no prg_prism_fwd (objects opened without their programs)")
	}
	ns, err := netnsutil.Open(f.Netns)
	if err != nil {
		return fmt.Errorf("prism: firewall gate: %w", err)
	}
	defer ns.Close()
	dir := datapath.ModePinDir(target, Name)
	for _, fam := range []struct {
		pf   link.NetfilterProtocolFamily
		name string
	}{{link.NetfilterProtoIPv4, "fwd4"}, {link.NetfilterProtoIPv6, "fwd6"}} {
		pin := bpfobj.LinkPin(dir, uint64(f.Inode), 0, "forward", fam.name)
		var l link.Link
		err := ns.Do(func() error {
			var err error
			l, err = link.AttachNetfilter(link.NetfilterOptions{Program: o.PrgPrismFwd, ProtocolFamily: fam.pf,
				Hook: link.NetfilterInetForward, Priority: fwPriority})
			return err
		})
		if err != nil {
			return fmt.Errorf("prism: %s: netfilter program at FORWARD (needs Linux 6.4+): %w", netnsutil.Label(f.Netns), err)
		}
		err = l.Pin(pin)
		if err != nil {
			_ = l.Close()
			return fmt.Errorf("prism: pin netfilter link: %w", err)
		}
		_ = l.Close()
		f.Pins = append(f.Pins, pin)
	}
	return nil
}

// addCtTable creates ctTable in ns (nft); an existing one is replaced by the same content.
func addCtTable(ns string) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("prism: nft (nftables) is not installed, so conntrack cannot be turned on; install nftables, or attach with conntrack=false where conntrack is already in use")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	script := fmt.Sprintf("table inet %[1]s {}\ndelete table inet %[1]s\ntable inet %[1]s {\n chain track {\n  ct state established counter\n }\n}\n", ctTable)
	cmd := netnsutil.Command(ctx, ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("prism: %s: nft: %w: %s", netnsutil.Label(ns), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeFirewall undoes followFirewall for every recorded namespace; a namespace that is gone
// took its hooks and table with it.
func removeFirewall(fs []fwNS) error {
	var errs []error
	for _, f := range fs {
		for _, p := range f.Pins {
			errs = append(errs, bpfobj.DetachPin(p))
		}
		if f.Conntrack && netnsutil.Exists(f.Netns) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := netnsutil.Run(ctx, f.Netns, "nft", "delete", "table", "inet", ctTable)
			cancel()
			if err != nil && !strings.Contains(out, "No such file") {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
