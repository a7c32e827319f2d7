package ezpath

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Name is the mode's name for attach/detach.
const Name = "ezpath"

// ezpath's pin directory (datapath.ModePinDir) holds host/ (host programs and maps) and tor/
// (the data plane of the host's ToR switch), each with its tcx links in links/.

// agentKit starts and stops the lab's controller (internal/datapath/agentproc).
const agentKit = agentproc.Agent(Name)

type mode struct{}

func init() { datapath.Register(mode{}) }

func (mode) Name() string { return Name }
func (mode) Summary() string {
	return "EZPath: selected flows skip the hosts' VXLAN stack; the ToR switches (lab --tor) encapsulate, hosts only tag (802.1Q)"
}

// modeState is ezpath's part of a host's attachment record.
type modeState struct {
	Config  Config   `json:"config"`
	Host    int      `json:"host"`
	Relay   bool     `json:"relay"`             // the relay pairs exist (or are being made)
	Tenants int      `json:"tenants,omitempty"` // the lab's tenants: one relay pair each (0: one)
	Links   []string `json:"links,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// Options declares ezpath's options (Config).
func (mode) Options() *option.Schema { return schema }

// Knobs: RPS on every container port (the bridge-side veth). A container's segments reach its
// port from two CPUs (the application's sends, and sends clocked by ACKs in the receive
// softirq); on the overlay they queue behind the bridge and the VXLAN device, but tagged and
// redirected straight to the uplink they would interleave, and TCP sees reordering. RPS keeps
// each flow on one CPU (of --cpus, default all), in order, as a NIC's TX queue would.
func (mode) Knobs(t *datapath.Topology, o datapath.Options) ([]datapath.Knob, error) {
	cfg, err := configOf(o)
	if err != nil {
		return nil, err
	}
	r, err := openRack(cfg.Lab)
	if err != nil {
		return nil, err
	}
	if _, err := r.hostIndex(t.Host); err != nil {
		return nil, err
	}
	cpus := o.CPUs
	if len(cpus) == 0 {
		if cpus, err = cpuset.Online(); err != nil {
			return nil, err
		}
	}
	var ks []datapath.Knob
	for _, d := range t.ByStage(datapath.StageVethHost) {
		paths, err := datapath.RxQueueKnobs(d, "rps_cpus")
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			ks = append(ks, datapath.Knob{Netns: d.Netns, Path: p, New: cpuset.Mask(cpus)})
		}
	}
	return ks, nil
}

func (m mode) Load(ctx context.Context, t *datapath.Topology, o datapath.Options, st *datapath.State) error {
	cfg, err := configOf(o)
	if err != nil {
		return err
	}
	r, err := openRack(cfg.Lab)
	if err != nil {
		return err
	}
	i, err := r.hostIndex(st.Target)
	if err != nil {
		return err
	}
	dir := datapath.ModePinDir(st.Target, Name)
	if err := bpfobj.CheckNoPins(who, dir); err != nil {
		return err
	}
	ms := modeState{Config: cfg, Host: i, Relay: true, Tenants: r.tenants}
	st.Pins = append(st.Pins, dir)
	save := func() error { return datapath.SaveModeState(st, ms) }
	if err := save(); err != nil {
		return err
	}
	hns, tns := r.hw.HostNs(i), r.hw.ToRNs(i)
	if err := r.checkPorts(i); err != nil {
		return err
	}
	for tn := 1; tn <= r.tenants; tn++ {
		if err := createRelay(hns, RelayHostDev(tn), r.hw.OverlayNs(i, tn), r.hw.MTU()); err != nil {
			return err
		}
	}
	ho, err := newHostObjects()
	if err != nil {
		return err
	}
	defer ho.Close()
	if err := bpfobj.Pin(who, r.hostDir(i), ho); err != nil {
		return err
	}
	to, err := newTorObjects(cfg.TableSize)
	if err != nil {
		return err
	}
	defer to.Close()
	if err := bpfobj.Pin(who, r.torDir(i), to); err != nil {
		return err
	}
	notes, err := configureHost(r, i, t, ho)
	if err != nil {
		return err
	}
	ms.Notes = notes
	if err := configureToR(r, i, t, to); err != nil {
		return err
	}
	// Receive side first (switch uplink, host uplink, relay, delivery), then the sending side,
	// so nothing is tagged before every hop can take it.
	type piece struct {
		ns, dev, dir string
		prog         *ebpf.Program
	}
	up, down := r.hw.ToRPorts()
	pieces := []piece{
		{tns, up, r.torDir(i), to.PrgEzpTorUp},
		{tns, down, r.torDir(i), to.PrgEzpTorDn},
	}
	for tn := 1; tn <= r.tenants; tn++ {
		pieces = append(pieces, piece{r.hw.OverlayNs(i, tn), RelayDev, r.hostDir(i), ho.PrgEzpDeliver})
	}
	pieces = append(pieces, piece{hns, "eth0", r.hostDir(i), ho.PrgEzpUplink})
	for tn := 1; tn <= r.tenants; tn++ {
		pieces = append(pieces, piece{hns, RelayHostDev(tn), r.hostDir(i), ho.PrgEzpRelay})
	}
	// The gate's far end on every pod's own eth0, before anything is tagged.
	for _, d := range t.ByStage(datapath.StageVeth) {
		pieces = append(pieces, piece{d.Netns, d.Name, r.hostDir(i), ho.PrgEzpDlv})
	}
	for _, d := range t.ByStage(datapath.StageVethHost) {
		pieces = append(pieces, piece{d.Netns, d.Name, r.hostDir(i), ho.PrgEzpPort})
	}
	for _, p := range pieces {
		idx, err := ifindexIn(p.ns, p.dev)
		if err != nil {
			return err
		}
		ino, err := netnsutil.Inode(netnsutil.Path(p.ns))
		if err != nil {
			return err
		}
		pin := bpfobj.LinkPin(p.dir, ino, idx, p.dev, "")
		if err := bpfobj.AttachTCX(p.prog, p.ns, idx, false, pin); err != nil {
			return fmt.Errorf("ezpath: %s/%s: %w", p.ns, p.dev, err)
		}
		ms.Links = append(ms.Links, pin)
		if err := save(); err != nil {
			return err
		}
	}
	// One controller per lab: the first host's attachment runs it (it needs every host's
	// tables, and hosts attached later join its view on its next poll).
	if i == 1 {
		if err := agentKit.Start(st); err != nil {
			return err
		}
	}
	return save()
}

// checkPorts refuses a host whose tenants' container ports share an ifindex: the egress table
// keys a port by ifindex, so one tenant's rule would tag another tenant's frames (lab --tenants
// gives every tenant's ports distinct ifindexes).
func (r *rack) checkPorts(i int) error {
	seen := map[int]endpoint{}
	for _, e := range r.eps {
		if e.Host != i {
			continue
		}
		idx, err := r.portIfindex(e)
		if err != nil {
			return err
		}
		if o, ok := seen[idx]; ok && o.Tenant != e.Tenant {
			return fmt.Errorf("ezpath: the ports of %s (tenant %d) and %s (tenant %d) on h%d share ifindex %d: tenants could not be told apart; rebuild the lab with `peregrine lab up --tenants`",
				o.Name, o.Tenant, e.Name, e.Tenant, i, idx)
		}
		seen[idx] = e
	}
	return nil
}

// configureHost fills the host tables: the relays' ifindexes, each tenant's VID (its endpoint
// domain and relay) and every local pod (delivery never depends on the offload state, so a
// tagged frame always finds its pod).
func configureHost(r *rack, i int, t *datapath.Topology, ho *hostObjects) ([]string, error) {
	hns := r.hw.HostNs(i)
	up, err := ifindexIn(hns, "eth0")
	if err != nil {
		return nil, err
	}
	vxs, err := endpoints.DiscoverVXLAN(t)
	if err != nil {
		return nil, err
	}
	for tn := 1; tn <= r.tenants; tn++ {
		ons := r.hw.OverlayNs(i, tn)
		rh, err := ifindexIn(hns, RelayHostDev(tn))
		if err != nil {
			return nil, err
		}
		ro, err := ifindexIn(ons, RelayDev)
		if err != nil {
			return nil, err
		}
		if tn == 1 { // the defaults: tenant 1's relay
			if err := ho.EzpHostCfg.Put(uint32(0), hostEzpHostCfg{Uplink: uint32(up), RelayHost: uint32(rh), RelayOv: uint32(ro),
				VerifyNs: uint64(gateVerify), WindowNs: uint64(gateWindow)}); err != nil {
				return nil, fmt.Errorf("ezpath: host config: %w", err)
			}
		}
		ino, err := netnsutil.Inode(netnsutil.Path(ons))
		if err != nil {
			return nil, err
		}
		// The tenant's VXLAN device: a tagged frame for an address with no pod entry goes
		// there, into the overlay's normal path.
		var vx uint32
		for _, v := range vxs {
			if v.Inode == uint32(ino) {
				vx = uint32(v.Dev.Ifindex)
			}
		}
		if vx == 0 {
			return nil, fmt.Errorf("ezpath: tenant %d: no VXLAN device in %s: offloaded flows need the overlay's normal path to verify them against", tn, ons)
		}
		if err := ho.EzpHostVid.Put(uint32(r.vid(tn)), hostEzpVidVal{Domain: uint32(ino), Relay: uint32(rh), Vx: vx}); err != nil {
			return nil, fmt.Errorf("ezpath: tenant %d VID: %w", tn, err)
		}
	}
	eps, notes := endpoints.Discover(t, vxs)
	rep, err := endpoints.Sync(endpoints.Tables{EP: ho.PrgEzpEp, Port: ho.PrgEzpPodport}, eps, time.Now())
	if err != nil {
		return nil, fmt.Errorf("ezpath: pod table: %w", err)
	}
	for _, c := range rep.Conflicts {
		notes = append(notes, c.String())
	}
	// The gate's far end: what each pod device is, from the host side (prg_ezp_pod).
	pods, podNotes := endpoints.Pods(t, vxs)
	notes = append(notes, podNotes...)
	for _, pd := range pods {
		idx, err := ifindexIn(pd.Ctr.Netns, pd.Ctr.Name)
		if err != nil {
			return nil, err
		}
		hidx, err := ifindexIn(pd.Host.Netns, pd.Host.Name)
		if err != nil {
			return nil, err
		}
		ino, err := netnsutil.Inode(netnsutil.Path(pd.Ctr.Netns))
		if err != nil {
			return nil, err
		}
		if err := ho.PrgEzpPod.Put(hostPrgDevKey{Netns: uint32(ino), Ifindex: uint32(idx)}, hostEzpPod{Domain: pd.VX.Inode, Ifindex: uint32(hidx)}); err != nil {
			return nil, fmt.Errorf("ezpath: pod map: %w", err)
		}
	}
	return notes, nil
}

// configureToR programs host i's switch: its VTEP, each tenant's (port, VID) -> VNI and the
// underlay routes to every other ToR and host.
func configureToR(r *rack, i int, t *datapath.Topology, to *torObjects) error {
	s := r.hw
	cfg := torEzpTorCfg{Vtep: nbo(r.vtep(i))}
	ports, err := t.VXLANPortSet()
	if err != nil {
		return err
	}
	copy(cfg.VxlanPorts[:], ports)
	if cfg.VxlanPorts[0] == 0 {
		cfg.VxlanPorts[0] = uint16(s.VXLANPort())
	}
	if err := to.EzpTorCfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("ezpath: switch config: %w", err)
	}
	for tn := 1; tn <= r.tenants; tn++ {
		if err := to.EzpVlanToVni.Put(torEzpPortVid{Ifindex: uint32(r.downIfindex(i)), Vid: uint32(r.vid(tn))}, r.vni(tn)); err != nil {
			return fmt.Errorf("ezpath: ezp_vlan_to_vni: %w", err)
		}
	}
	upDev, _ := s.ToRPorts()
	up, err := ifindexIn(r.hw.ToRNs(i), upDev)
	if err != nil {
		return err
	}
	for k := 1; k <= s.Hosts(); k++ {
		if k == i {
			continue
		}
		nh := torEzpNexthop{Ifindex: uint32(up), Smac: mac6(s.ToRUpMAC(i)), Dmac: mac6(s.ToRUpMAC(k))}
		for _, a := range []uint32{nbo(s.ToRAddr(k)), nbo(s.HostAddr(k))} {
			if err := to.EzpIpv4Lpm.Put(torEzpLpmKey{Prefixlen: 32, Addr: a}, nh); err != nil {
				return fmt.Errorf("ezpath: ezp_ipv4_lpm: %w", err)
			}
		}
	}
	return nil
}

// Unload takes the host's pairs off the switch path (in the mandatory order), detaches the
// programs and removes the relay pair; the framework removes the pins afterwards.
func (mode) Unload(_ context.Context, st *datapath.State) error {
	errs := []error{agentKit.Stop(st)}
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		errs = append(errs, err)
	}
	if ms.Config.Lab != "" {
		errs = append(errs, unoffloadHost(ms.Config.Lab, ms.Host, ms.Config.Drain))
	}
	dir := datapath.ModePinDir(st.Target, Name)
	for _, sub := range []string{"host", "tor"} {
		for _, pin := range bpfobj.LinkPins(filepath.Join(dir, sub)) {
			errs = append(errs, bpfobj.DetachPin(pin))
		}
	}
	if ms.Relay {
		for tn := 1; tn <= max(ms.Tenants, 1); tn++ {
			errs = append(errs, deleteRelay(st.Target, RelayHostDev(tn)))
		}
	}
	if ms.Config.Lab != "" && !otherHostsAttached(ms.Config.Lab, st.Target) {
		errs = append(errs, removeLedger(ms.Config.Lab))
	}
	return errors.Join(errs...)
}

// unoffloadHost moves every pair with an end on host i back to the overlay. A lab that is being
// torn down (namespaces gone) has nothing left to order: the ledger just forgets the pairs.
func unoffloadHost(labName string, i int, drain time.Duration) error {
	r, rerr := openRack(labName)
	return withLedger(labName, func(l *Ledger) error {
		var keep, gone []Pair
		for _, p := range l.Pairs {
			// Without the rack (the lab is gone) no pair of its ledger can be kept.
			if rerr != nil || r.hostOf(p.A) == i || r.hostOf(p.B) == i {
				gone = append(gone, p)
			} else {
				keep = append(keep, p)
			}
		}
		l.Pairs = keep
		if rerr != nil {
			return nil
		}
		var errs []error
		for _, p := range gone {
			a, err1 := r.endpoint(p.A)
			b, err2 := r.endpoint(p.B)
			if err1 == nil && err2 == nil {
				errs = append(errs, r.remove(a, b, keep, drain))
			}
		}
		return errors.Join(errs...)
	})
}

func otherHostsAttached(labName, self string) bool {
	states, _ := datapath.AllStates()
	for _, st := range states {
		if st.Mode != Name || st.Target == self {
			continue
		}
		if ms, err := datapath.LoadModeState[modeState](st); err == nil && ms.Config.Lab == labName {
			return true
		}
	}
	return false
}

// Example shows the mode in `attach --help`.
func (mode) Example() string {
	return `  sudo peregrine attach ezpath --lab --policy auto --table-size 64   # a lab built with --tor
  sudo peregrine attach ezpath --lab --policy manual                 # then: peregrine ezpath offload`
}
