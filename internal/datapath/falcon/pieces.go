package falcon

import (
	"fmt"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Piece is one device falcon attached a program to: the underlay (ingress, decides the VXLAN
// stage) or a bridge port (egress, decides its veth peer's stage).
type Piece struct {
	Dev     datapath.Dev `json:"dev"`
	Inode   uint64       `json:"netns_inode"`
	Stage   uint32       `json:"stage"` // StageID*
	Salt    uint32       `json:"salt"`  // salt of the stage it decides
	LinkPin string       `json:"link_pin"`
	// Next is the device whose RPS applies the decision (a bridge port's veth peer); zero for the
	// underlay (it decides every VXLAN device behind it).
	Next datapath.Dev `json:"next"`
}

// modeState is falcon's part of the attachment record.
type modeState struct {
	Pieces    []Piece  `json:"pieces"`
	SplitPins []string `json:"split_pins,omitempty"` // grosplit's pins (--split)
}

func (p Piece) key() string { return fmt.Sprintf("%d/%d/%s", p.Inode, p.Dev.Ifindex, p.Dev.Name) }

// inodeOf returns the namespace inode of a device's namespace.
func inodeOf(ns string) (uint64, error) {
	ino, err := netnsutil.Inode(netnsutil.Path(ns))
	if err != nil {
		return 0, fmt.Errorf("falcon: namespace %q: %w", ns, err)
	}
	return ino, nil
}

// devOf looks up the current ifindex of a device ("netns/name" as Dev.String prints it) among devs.
func devByString(devs []datapath.Dev, s string) (datapath.Dev, bool) {
	for _, d := range devs {
		if d.String() == s {
			return d, true
		}
	}
	return datapath.Dev{}, false
}

// attachPiece puts the program on the device (tcx, inside its namespace), tells the program what
// the device decides, and pins the link so it outlives this process.
func attachPiece(o *objects, target string, p *Piece) error {
	ns, err := netnsutil.Open(p.Dev.Netns)
	if err != nil {
		return fmt.Errorf("falcon: %s: %w", p.Dev, err)
	}
	defer ns.Close()
	return attachPieceIn(o, ns, target, p)
}

// attachPieceIn is attachPiece in the device's namespace, already open.
func attachPieceIn(o *objects, ns *netnsutil.NS, target string, p *Piece) error {
	if err := o.setDev(p.Inode, p.Dev.Ifindex, p.Salt, p.Stage); err != nil {
		return fmt.Errorf("falcon: %s: device map: %w", p.Dev, err)
	}
	prog, egress := o.PrgFalconPort, true
	if p.Stage == StageIDVXLAN {
		prog, egress = o.PrgFalconNic, false
	}
	p.LinkPin = bpfobj.LinkPin(datapath.ModePinDir(target, Name), p.Inode, p.Dev.Ifindex, p.Dev.Name, "")
	if err := bpfobj.AttachTCXIn(prog, ns, p.Dev.Ifindex, egress, p.LinkPin); err != nil {
		o.delDev(p.Inode, p.Dev.Ifindex)
		return fmt.Errorf("falcon: %s: %w", p.Dev, err)
	}
	return nil
}

// detachPiece detaches the device's link, removes its pin and forgets the device.
func detachPiece(o *objects, p Piece) error {
	if o != nil {
		o.delDev(p.Inode, p.Dev.Ifindex)
	}
	if err := bpfobj.DetachPin(p.LinkPin); err != nil {
		return fmt.Errorf("falcon: %s: %w", p.Dev, err)
	}
	return nil
}

// stageKnobs plans the knobs of a device whose RPS applies falcon's choice: the FALCON set as its
// RPS mask (so the RPS map is exactly the set, ascending) and no RFS flow table (RFS would follow
// the application's CPU instead of the hash).
func stageKnobs(d datapath.Dev, mask string) ([]datapath.Knob, error) {
	var ks []datapath.Knob
	for file, v := range map[string]string{"rps_cpus": mask, "rps_flow_cnt": "0"} {
		paths, err := datapath.RxQueueKnobs(d, file)
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			ks = append(ks, datapath.Knob{Netns: d.Netns, Path: p, New: v})
		}
	}
	return ks, nil
}

// desiredPieces lists the devices of a topology falcon attaches to.
func desiredPieces(t *datapath.Topology) ([]Piece, []string, error) {
	var ps []Piece
	var notes []string
	for _, d := range t.ByStage(datapath.StageNIC) {
		ino, err := inodeOf(d.Netns)
		if err != nil {
			return nil, nil, err
		}
		ps = append(ps, Piece{Dev: d, Inode: ino, Stage: StageIDVXLAN, Salt: DeviceSalt(ino, d.Ifindex)})
	}
	for _, d := range t.ByStage(datapath.StageVethHost) {
		next, ok := devByString(t.Devs, d.Peer)
		if d.Peer == "" || !ok {
			notes = append(notes, fmt.Sprintf("%s: veth peer not found, its stage is left alone", d))
			continue
		}
		ino, err := inodeOf(d.Netns)
		if err != nil {
			return nil, nil, err
		}
		nino, err := inodeOf(next.Netns)
		if err != nil {
			return nil, nil, err
		}
		ps = append(ps, Piece{Dev: d, Inode: ino, Stage: StageIDVeth, Salt: DeviceSalt(nino, next.Ifindex), Next: next})
	}
	return ps, notes, nil
}
