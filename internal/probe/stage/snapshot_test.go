package stage

import "testing"

func TestSubPairsByDeviceAndCPU(t *testing.T) {
	k1, k2 := DevKey{Netns: 1, Ifindex: 2}, DevKey{Netns: 3, Ifindex: 2}
	prev := Snapshot{
		Devices: []DevCPU{
			{DevKey: k1, CPU: 0, Counts: Counts{Packets: 10, SoftirqNs: 100}},
			{DevKey: k1, CPU: 1, Counts: Counts{Packets: 5}},
			{DevKey: k2, CPU: 0, Counts: Counts{Packets: 7}},
		},
		CPUs: []CPUTotals{{CPU: 0, NetRxNs: 1000}, {CPU: 1, NetRxNs: 50}},
	}
	cur := Snapshot{
		Devices: []DevCPU{
			{DevKey: k1, CPU: 0, Counts: Counts{Packets: 15, SoftirqNs: 160}},
			{DevKey: k1, CPU: 1, Counts: Counts{Packets: 5}}, // idle: dropped
			{DevKey: k2, CPU: 0, Counts: Counts{Packets: 9}},
			{DevKey: k2, CPU: 1, Counts: Counts{Polls: 1}}, // new since prev
		},
		CPUs: []CPUTotals{{CPU: 0, NetRxNs: 1500}, {CPU: 1, NetRxNs: 50}},
	}
	d := cur.Sub(prev)
	if len(d.Devices) != 3 {
		t.Fatalf("want 3 active entries, got %+v", d.Devices)
	}
	if got := d.Device(k1); got != (Counts{Packets: 5, SoftirqNs: 60}) {
		t.Errorf("k1: %+v", got)
	}
	if got := d.Device(k2); got != (Counts{Packets: 2, Polls: 1}) {
		t.Errorf("k2: %+v", got)
	}
	if d.CPUs[0].NetRxNs != 500 || d.CPUs[1].NetRxNs != 0 {
		t.Errorf("cpus: %+v", d.CPUs)
	}
}

func TestSubMissed(t *testing.T) {
	if got := (Snapshot{Missed: 7}).Sub(Snapshot{Missed: 2}).Missed; got != 5 {
		t.Errorf("missed between snapshots %d, want 5", got)
	}
	// A pairing the wrong way round must not wrap around.
	if got := (Snapshot{Missed: 2}).Sub(Snapshot{Missed: 7}).Missed; got != 0 {
		t.Errorf("missed, pairs swapped: %d, want 0", got)
	}
}
