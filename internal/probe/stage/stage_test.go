package stage

import (
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

const (
	flowPackets = 2000
	payload     = 64
)

// sendFlow sends flowPackets datagrams a -> b after a warm-up datagram (which resolves ARP, so
// the counted flow has no neighbour traffic in it) and returns how many b received.
func sendFlow(t *testing.T, probe *Probe) (before, after Snapshot, received int) {
	t.Helper()
	send, recv := udpPair(t)
	buf := make([]byte, payload)
	if _, err := send.Write(buf); err != nil {
		t.Fatalf("warm-up send: %v", err)
	}
	recv.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := recv.Read(make([]byte, 2048)); err != nil {
		t.Fatalf("warm-up datagram did not arrive: %v", err)
	}

	var err error
	if before, err = probe.Snapshot(); err != nil {
		t.Fatal(err)
	}
	got := make(chan int)
	go func() {
		n := 0
		rb := make([]byte, 2048)
		for n < flowPackets {
			// The socket may drop some datagrams (full buffer): stop once b has been idle a while.
			recv.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := recv.Read(rb); err != nil {
				break
			}
			n++
		}
		got <- n
	}()
	for i := 0; i < flowPackets; i++ {
		if _, err := send.Write(buf); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	received = <-got
	if after, err = probe.Snapshot(); err != nil {
		t.Fatal(err)
	}
	return before, after, received
}

func TestProbeAttributesFlowToReceivingVeth(t *testing.T) {
	needRoot(t)
	p := buildPair(t)

	t.Run("filtered", func(t *testing.T) {
		probe := startProbe(t, Options{NetnsNames: []string{nsA, nsB}})
		before, after, received := sendFlow(t, probe)
		d := after.Sub(before)
		logSnapshot(t, d)
		t.Logf("b received %d of %d datagrams", received, flowPackets)

		// Floors of half the flow: on Linux 6.18 the programs are sometimes not run for an event
		// the tracepoint fires when the machine is busy (up to 36 % of a window seen, with no
		// recursion miss reported; labtest.StageCPUs has the evidence). Idle, all are counted.
		b := d.Device(p.devB)
		if b.Packets < flowPackets/2 {
			t.Errorf("%s in %s: %d packets at netif_receive_skb, want >= %d", vethB, nsB, b.Packets, flowPackets/2)
		}
		t.Logf("%s in %s: %d packets of %d sent", vethB, nsB, b.Packets, flowPackets)
		if min := uint64(flowPackets / 2 * (payload + 28)); b.Bytes < min { // + IPv4 and UDP headers
			t.Errorf("%s in %s: %d bytes, want >= %d", vethB, nsB, b.Bytes, min)
		}
		if b.SoftirqNs == 0 {
			t.Errorf("%s in %s: no NET_RX softirq time attributed", vethB, nsB)
		}
		// Unsegmented datagrams: gso_segs (read through skb_shared_info) is 0, counted as 1.
		if b.Segs != b.Packets {
			t.Errorf("%s in %s: %d segments for %d packets, want equal", vethB, nsB, b.Segs, b.Packets)
		}
		assertFlowNotElsewhere(t, d, p)
		for _, dev := range d.Devices {
			if dev.DevKey != (DevKey{}) && dev.Netns != p.inoA && dev.Netns != p.inoB {
				t.Errorf("filter leaked: device %+v (%s) outside %s/%s counted", dev.DevKey, dev.Name, nsA, nsB)
			}
		}
		assertTimeAddsUp(t, d)

		// Names: the probe records the kernel's name; Annotate adds the namespace's name.
		if i := slices.IndexFunc(d.Devices, func(x DevCPU) bool { return x.DevKey == p.devB }); i < 0 || d.Devices[i].Name != vethB {
			t.Errorf("recorded name of %+v: want %q, snapshot has %+v", p.devB, vethB, d.Devices)
		}
		names, err := ResolveDevices()
		if err != nil {
			t.Logf("resolve (partial is fine): %v", err)
		}
		d.Annotate(names)
		for _, dev := range d.Devices {
			if dev.DevKey == p.devB && (dev.Name != vethB || dev.NetnsName != nsB) {
				t.Errorf("annotated %+v as %s/%s, want %s/%s", dev.DevKey, dev.NetnsName, dev.Name, nsB, vethB)
			}
		}
	})

	t.Run("unfiltered", func(t *testing.T) {
		probe := startProbe(t, Options{})
		before, after, _ := sendFlow(t, probe)
		d := after.Sub(before)
		if b := d.Device(p.devB); b.Packets < flowPackets/2 { // (the floor: see "filtered")
			t.Errorf("%s in %s: %d packets, want >= %d", vethB, nsB, b.Packets, flowPackets/2)
		}
		assertFlowNotElsewhere(t, d, p)
	})

	t.Run("filter-excludes", func(t *testing.T) {
		probe := startProbe(t, Options{NetnsNames: []string{nsA}})
		before, after, _ := sendFlow(t, probe)
		d := after.Sub(before)
		if b := d.Device(p.devB); b != (Counts{}) {
			t.Errorf("%s is in %s, outside the filter, yet counted: %+v", vethB, nsB, b)
		}
	})
}

// assertFlowNotElsewhere checks that no device of a's or b's namespace but b's veth saw anything
// like the flow's packet count: the packets sent from a must not be charged to a's veth (the
// transmitter) nor to either loopback. Devices of other namespaces are not judged: the machine is
// shared, and their counts cannot be told apart from this flow's (the filtered run checks that a
// wrong netns key cannot hide there). The per-CPU backlog is a queue, not a device: skipped too.
func assertFlowNotElsewhere(t *testing.T, d Snapshot, p pair) {
	t.Helper()
	for k, c := range d.ByDevice() {
		if k == p.devB || (k.Netns != p.inoA && k.Netns != p.inoB) {
			continue
		}
		if c.Packets >= flowPackets/10 || c.RxPackets >= flowPackets/10 {
			t.Errorf("device %+v got %d packets (%d via netif_rx) during the a->b flow; want < %d", k, c.Packets, c.RxPackets, flowPackets/10)
		}
	}
}

// assertTimeAddsUp checks the attribution invariant: per CPU, time charged to devices plus the
// unattributed time equals the NET_RX time, up to softirq runs cut by the snapshots.
func assertTimeAddsUp(t *testing.T, d Snapshot) {
	t.Helper()
	perCPU := map[int]uint64{}
	for _, dev := range d.Devices {
		perCPU[dev.CPU] += dev.SoftirqNs
	}
	var total uint64
	for _, c := range d.CPUs {
		total += c.NetRxNs
		charged := perCPU[c.CPU] + c.UnattributedNs
		// A run in progress at a snapshot has charged segments but not yet its total: allow 2 ms.
		if charged > c.NetRxNs+2_000_000 {
			t.Errorf("cpu %d: %d ns charged but only %d ns of NET_RX measured", c.CPU, charged, c.NetRxNs)
		}
	}
	if total == 0 {
		t.Errorf("no NET_RX softirq time measured on any CPU")
	}
}

func TestCloseDetachesEverything(t *testing.T) {
	needRoot(t)
	probe, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := probe.ProgramIDs()
	if err != nil {
		probe.Close()
		t.Fatal(err)
	}
	if len(ids) != 5 {
		t.Errorf("want 5 programs, got IDs %v", ids)
	}
	if got := linkedPrograms(t, ids); len(got) != len(ids) {
		t.Errorf("while running: links exist for programs %v, want all of %v", got, ids)
	}
	if err := probe.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := probe.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}

	if got := linkedPrograms(t, ids); len(got) > 0 {
		t.Errorf("after Close: programs %v still attached", got)
	}
	// The kernel frees a program once no link or fd holds it; that may lag a little (RCU).
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range ids {
		for {
			prog, err := ebpf.NewProgramFromID(id)
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if err == nil {
				prog.Close()
			}
			if time.Now().After(deadline) {
				t.Errorf("program %d still exists after Close (err %v)", id, err)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := probe.Snapshot(); err == nil {
		t.Errorf("snapshot of a closed probe succeeded")
	}
}

// linkedPrograms returns those of ids that some BPF link in the kernel points at.
func linkedPrograms(t *testing.T, ids []ebpf.ProgramID) []ebpf.ProgramID {
	t.Helper()
	var found []ebpf.ProgramID
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			continue // the link went away between listing and asking
		}
		if slices.Contains(ids, info.Program) {
			found = append(found, info.Program)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate links: %v", err)
	}
	return found
}

func startProbe(t *testing.T, opts Options) *Probe {
	t.Helper()
	probe, err := Start(opts)
	if err != nil {
		t.Fatalf("start probe: %v", err)
	}
	t.Cleanup(func() {
		if err := probe.Close(); err != nil {
			t.Errorf("close probe: %v", err)
		}
	})
	return probe
}

func logSnapshot(t *testing.T, s Snapshot) {
	t.Helper()
	for _, d := range s.Devices {
		t.Logf("netns %d if %d %-10s cpu %d: %+v", d.Netns, d.Ifindex, d.Name, d.CPU, d.Counts)
	}
	for _, c := range s.CPUs {
		t.Logf("cpu %d: %+v", c.CPU, c)
	}
}
