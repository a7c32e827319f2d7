package prism

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Counters implements metrics.ModeCounters (peregrine_mode_packets_total and
// peregrine_mode_table_entries): the programs' counters as direction "hp" (prg_prism_vx and the
// gate), "gate" (prg_prism_dlv, the normal path's deliveries) and "iso" (prg_prism_nic); the
// endpoint table's live entries, the pod devices carrying the gate and the addresses refused as
// claimed by several pods (now, and since attach).
func (mode) Counters(st *datapath.State) (map[[2]string]uint64, map[string]int, error) {
	v, err := Inspect(st.Target)
	if err != nil {
		return nil, nil, err
	}
	s := v.Stats
	pk := map[[2]string]uint64{}
	for n, c := range map[string]uint64{"seen": s.Seen, "hp": s.HP, "lp": s.LP, "redirected": s.Redirected, "unparsed": s.Unparsed,
		"no_endpoint": s.Miss, "gone": s.Gone, "stale": s.Stale, "l2": s.L2, "ttl": s.TTL, "error": s.Err, "learning": s.Learn,
		"not_tcp_udp": s.NoTCPUDP, "no_conntrack": s.NoCT, "conntrack_new": s.CTNew, "not_delivered": s.Unseen,
		"delivered_elsewhere": s.Elsewhere, "reverify": s.Probe, "conntrack_strict": s.Strict, "liberal_ask_lost": s.AskLost} {
		pk[[2]string{"hp", n}] = c
	}
	pk[[2]string{"gate", "delivered"}] = s.Delivered
	pk[[2]string{"gate", "unknown_pod"}] = s.DlvNoPod
	for n, c := range map[string]uint64{"vxlan": s.IsoVXLAN, "hp": s.IsoHP, "lp": s.IsoLP, "stay": s.IsoStay, "off": s.IsoOff} {
		pk[[2]string{"iso", n}] = c
	}
	live := 0
	for _, e := range v.Endpoints {
		if !e.Gone && e.Held {
			live++
		}
	}
	return pk, map[string]int{"endpoints": live, "pods_gated": v.Pods,
		"endpoint_conflicts": len(v.Conflicts), "endpoint_conflicts_seen": v.ConflictsSeen}, nil
}
