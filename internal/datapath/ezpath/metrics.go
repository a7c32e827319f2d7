package ezpath

import "github.com/peregrine-net/peregrine/internal/datapath"

// Counters implements metrics.ModeCounters (peregrine_mode_packets_total and
// peregrine_mode_table_entries): the host's programs as direction "host", its switch's as "tor",
// by counter name; the switch tables' occupancy and the lab's offloaded pairs.
func (mode) Counters(st *datapath.State) (map[[2]string]uint64, map[string]int, error) {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		return nil, nil, err
	}
	r, err := openRack(ms.Config.Lab)
	if err != nil {
		return nil, nil, err
	}
	ht, err := openHostTables(r.hostDir(ms.Host))
	if err != nil {
		return nil, nil, err
	}
	defer ht.Close()
	tt, err := openTorTables(r.torDir(ms.Host))
	if err != nil {
		return nil, nil, err
	}
	defer tt.Close()
	hs, err := hostStats(ht)
	if err != nil {
		return nil, nil, err
	}
	ts, err := torStats(tt)
	if err != nil {
		return nil, nil, err
	}
	pk := map[[2]string]uint64{}
	for n, v := range hs {
		pk[[2]string{"host", n}] = v
	}
	for n, v := range ts {
		pk[[2]string{"tor", n}] = v
	}
	led, err := ReadLedger(ms.Config.Lab)
	if err != nil {
		return nil, nil, err
	}
	return pk, map[string]int{"ezp_encap": countEntries(tt.EzpEncap), "ezp_decap": countEntries(tt.EzpDecap),
		"ezp_flow_bytes": countEntries(tt.EzpFlowBytes), "offloaded_pairs": len(led.Pairs)}, nil
}
