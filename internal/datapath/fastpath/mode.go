// Package fastpath is peregrine's overlay fast path (`peregrine attach fastpath`): per-flow
// caches learned from the kernel's normal overlay path, replayed in tc eBPF so that a learned
// flow skips the VXLAN device, bridge, IP forwarding and veth backlog (flannel layout) or the
// bridge and veth backlog (docker layout). bpf/fastpath.bpf.c explains the datapath; a node
// agent (`peregrine agent fastpath`) keeps the pod table and programs current and forgets cached
// flows within a second of a neighbour, FDB, route, MTU, VXLAN device or pod change, and of a
// policy change the node signals (nftables rules, conntrack deletions, ipsets: policy.go).
package fastpath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Name is the mode's name.
const Name = "fastpath"

// Option keys (declared on Config).
const (
	OptAgent    = "agent"
	OptOneWay   = "one_way"
	OptVXLANDev = "vxlan_dev"
)

// Config is fastpath's typed configuration, saved in the record.
type Config struct {
	Agent  bool `json:"agent" opt:"agent" default:"true" help:"run the node agent (false: pods and devices are frozen at attach; flows still re-learn every few seconds)"`
	OneWay bool `json:"one_way" opt:"one_way" help:"a flow the normal path delivered to a pod takes the ingress fast path without waiting for the pod's reply (one-way streams such as UDP telemetry); default: only flows carried both ways"`
	// VXLANDev limits the fast path to the named VXLAN devices (names such as vxlan0, or
	// netns/name where several namespaces hold one of that name, as status prints them).
	VXLANDev []string `json:"vxlan_dev,omitempty" opt:"vxlan_dev" help:"only these VXLAN devices (name, or netns/name as status shows it; repeatable); default: every VXLAN overlay of the node, each with its own config"`
	BigTCP   int      `json:"big_tcp,omitempty" opt:"big_tcp" default:"0" range:"0..524280" help:"BIG TCP: raise the GSO and GRO sizes (IPv4 and legacy) of the pod veths, bridge and VXLAN device, and the underlay's GSO sizes, to this many bytes (above 65536, at most 524280; GSO capped at each device's tso_max_size); restored on detach. The fast path carries the pods' packets above 64 KiB; frames above 64 KiB arriving from the underlay take the normal path (counted as big). 0: off"`
}

var schema = option.Declare(Name, Config{})

// Options declares fastpath's options (Config).
func (mode) Options() *option.Schema { return schema }

func configOf(o datapath.Options) (Config, error) { return datapath.ConfigOf[Config](Name, o) }

type mode struct{}

func init() { datapath.Register(mode{}) }

func (mode) Name() string { return Name }
func (mode) Summary() string {
	return "overlay fast path: per-flow encap/decap caches learned from the normal path skip the VXLAN device, bridge and veth backlog (ONCache-style)"
}

// modeState is fastpath's part of the attachment record.
type modeState struct {
	Overlay  *overlay   `json:"overlay"`            // the first of Overlays (records before there were several)
	Overlays []*overlay `json:"overlays,omitempty"` // every overlay served, Index = position
	Notes    []string   `json:"notes,omitempty"`
}

// overlays are the overlays of a record (one for a record written before there were several).
func (ms *modeState) overlays() []*overlay {
	if len(ms.Overlays) > 0 {
		return ms.Overlays
	}
	if ms.Overlay != nil {
		return []*overlay{ms.Overlay}
	}
	return nil
}

// Knobs: with big_tcp, the GSO/GRO sizes of the overlay's devices (bigtcp.go). Nothing
// else: conntrack's TCP window check is relaxed per entry, for the fast path's own TCP flows
// only, by the agent (ctliberal.go), and nf_conntrack_tcp_be_liberal is left to the node.
// Unknown options are refused here, before anything changes.
func (mode) Knobs(t *datapath.Topology, o datapath.Options) ([]datapath.Knob, error) {
	c, err := configOf(o)
	if err != nil {
		return nil, err
	}
	return bigTCPKnobs(t, c.BigTCP)
}

func (mode) Load(_ context.Context, t *datapath.Topology, o datapath.Options, st *datapath.State) error {
	c, err := configOf(o)
	if err != nil {
		return err
	}
	ovs, notes, err := readOverlays(t, o.Underlay, c.VXLANDev)
	if err != nil {
		return err
	}
	// Pods first: a layout whose pods the fast path cannot serve is refused before anything
	// changes.
	var eps []endpoints.Endpoint
	perOv := make([][]endpoints.Endpoint, len(ovs))
	for _, ov := range ovs {
		ov.OneWay = c.OneWay
		e, epNotes := discoverPods(t, ov) // layout_calico.go: bridge ports and routed /32 pods
		notes = append(notes, epNotes...)
		if len(e) == 0 {
			w, err := noPods(ov)
			if err != nil {
				return err
			}
			notes = append(notes, w)
			st.Topology.Notes = append(st.Topology.Notes, "fastpath: "+w)
		}
		perOv[ov.Index] = e
		eps = append(eps, e...)
	}
	if _, err := os.Stat(datapath.ModePinDir(st.Target, Name)); err == nil {
		return fmt.Errorf("fastpath: %s already exists (a crashed attach?): run `peregrine detach` on %s first", datapath.ModePinDir(st.Target, Name), netnsutil.Label(st.Target))
	}
	objs, err := loadObjects()
	if err != nil {
		return err
	}
	defer objs.Close()
	dir := datapath.ModePinDir(st.Target, Name)
	if err := datapath.RecordThenCreate(st, dir, func() error { return pinObjects(objs, dir) }); err != nil {
		return err
	}
	p := &pinned{fpMaps: objs.fpMaps, fpPrograms: objs.fpPrograms, more: map[int]*fpPrograms{}}
	defer func() {
		for _, m := range p.more {
			m.Close()
		}
	}()
	for _, ov := range ovs[1:] {
		pp, err := loadOverlayPrograms(&objs.fpMaps, ov.Index)
		if err != nil {
			return err
		}
		p.more[ov.Index] = pp
		if err := pinPrograms(pp, dir, ov.Index); err != nil {
			return err
		}
	}
	ms := modeState{Overlay: ovs[0], Overlays: ovs, Notes: notes}
	for _, ov := range ovs {
		for _, u := range ov.Unsup {
			ms.Notes = append(ms.Notes, fmt.Sprintf("%s: %s is not reproduced: every packet takes the normal path", ov.VX.Dev, u))
		}
		if ov.UDPCsum {
			ms.Notes = append(ms.Notes, fmt.Sprintf("%s computes outer UDP checksums; fast-path frames carry 0 (RFC 7348 allows it over IPv4; eBPF cannot mark GSO packets for per-segment outer checksums)", ov.VX.Dev))
		}
	}
	if err := datapath.SaveModeState(st, ms); err != nil {
		return err
	}
	// Endpoints first, then the receive side, then the pods' side: a flow learns only once
	// every piece it needs is in place.
	if _, err := endpoints.Sync(p.tables(), eps, time.Now()); err != nil {
		return fmt.Errorf("fastpath: %w", err)
	}
	budget := flowBudget(p.PrgFastpathFlow.MaxEntries(), len(eps))
	for _, ov := range ovs {
		if err := p.PrgFastpathCfg.Put(uint32(ov.Index), cfgWith(ov, budget)); err != nil {
			return fmt.Errorf("fastpath: write config: %w", err)
		}
		dev6, err := putU6(p, ov.Underlay.Netns, ov) // flannel-v6.1 beside it: u6.go
		if err != nil {
			return err
		}
		ms.Notes = u6Notes(ms.Notes, dev6, ov)
		if err := attachOverlay(p, st.Target, ov); err != nil {
			return err
		}
	}
	for _, ov := range ovs {
		if _, err := attachPods(p, st.Target, ov, perOv[ov.Index]); err != nil {
			return err
		}
	}
	datapath.SetModeState(st, ms)
	for _, n := range policyNotes(t.Host, ovs, c.Agent) {
		st.Topology.Notes = append(st.Topology.Notes, "fastpath: "+n)
	}
	if c.Agent {
		return agentKit.Start(st)
	}
	return nil
}

// Unload stops the agent, turns the programs off (a packet in flight finds no config and takes
// the normal path) and removes the tcx links; the framework removes the pin directory after.
func (mode) Unload(_ context.Context, st *datapath.State) error {
	errs := []error{agentKit.Stop(st)}
	if p, err := openPinned(st.Target); err == nil {
		for i := range maxOverlays {
			_ = p.PrgFastpathCfg.Put(uint32(i), fpFpCfg{})
		}
		p.Close()
	}
	if err := os.RemoveAll(filepath.Join(datapath.ModePinDir(st.Target, Name), linksSub)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("fastpath: remove links: %w", err))
	}
	return errors.Join(errs...)
}

// Example shows the mode in `attach --help`.
func (mode) Example() string {
	return `  sudo peregrine attach fastpath --lab          # every lab host (start here)
  sudo peregrine attach fastpath                # this node's overlays (flannel.1/cni0, docker's vxlan0/br0 per overlay)
  sudo peregrine attach fastpath --vxlan-dev /var/run/docker/netns/1-abc/vxlan0   # one docker overlay only
  sudo peregrine attach fastpath --one-way      # one-way streams take the ingress fast path too`
}
