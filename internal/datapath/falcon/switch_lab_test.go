package falcon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
	"github.com/peregrine-net/peregrine/internal/workload/inject"
	"github.com/peregrine-net/peregrine/internal/workload/udpsink"
)

// UDP loss while falcon is attached and detached under a steady, sequence-numbered stream:
// measured and reported; moving a flow's stage to another CPU mid-stream may reorder a few
// datagrams, but must not lose more than a sliver of them.
func TestUDPLossAcrossAttachDetach(t *testing.T) {
	l := labUp(t, lab.Spec{Name: "tfalsw", Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
	spec := l.Spec
	host := labtest.NS(l, "h2")
	rcv := spec.ContainerAddr(2, 1).Addr()
	sink, err := udpsink.Listen(udpsink.Config{Netns: labtest.NS(l, "h2-c1"), Addr: rcv, Port: 9100, Duration: 6 * time.Second, IdleTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	type out struct {
		st  udpsink.Stats
		err error
	}
	sc := make(chan out, 1)
	go func() { st, err := sink.Run(context.Background()); sc <- out{st, err} }()
	cfg := inject.Config{
		Netns: labtest.NS(l, "h1"), Device: "eth0", DstMAC: inject.MAC(spec.UnderlayMAC(2)),
		SrcIP: spec.HostAddr(1).Addr(), DstIP: spec.HostAddr(2).Addr(), DstPort: uint16(spec.VXLANPort), VNI: uint32(spec.VNI),
		InnerSrcMAC: inject.MAC(spec.ContainerMAC(1, 1)), InnerDstMAC: inject.MAC(spec.ContainerMAC(2, 1)),
		InnerSrcIP: netip.MustParseAddr(spec.ContainerAddr(1, 1).Addr().String()), InnerDstIP: rcv,
		InnerDstPort: 9100, PayloadSize: 64, Flows: 4, Rate: 20000, Duration: 3 * time.Second,
	}
	ic := make(chan error, 1)
	var ist inject.Stats
	go func() { var err error; ist, err = inject.Run(context.Background(), cfg); ic <- err }()
	time.Sleep(time.Second)
	if _, err := datapath.Attach(context.Background(), host, "falcon", falconOpts()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-ic; err != nil {
		t.Fatal(err)
	}
	res := <-sc
	if res.err != nil {
		t.Fatal(res.err)
	}
	lost := int64(ist.Sent) - int64(res.st.Received)
	t.Logf("UDP across attach and detach: sent %d, received %d, lost %d (%.3f%%), reordered %d",
		ist.Sent, res.st.Received, lost, 100*float64(lost)/float64(ist.Sent), res.st.Reordered)
	if ist.Sent == 0 || float64(lost) > 0.02*float64(ist.Sent) {
		t.Fatalf("lost %d of %d datagrams across attach/detach", lost, ist.Sent)
	}
}

// A VXLAN device created after attach is steered within a second (its RPS knobs recorded and
// set, its UDP port in the programs' port set); detach restores it like the others.
func TestAgentFollowsNewVXLANDevice(t *testing.T) {
	l := labUp(t, lab.Spec{Name: "tfalvx", Style: lab.StyleFlannel, Containers: 1})
	host := l.Hosts[0].Netns
	before := labtest.RxKnobs(t, l, "rps_cpus")
	if _, err := datapath.Attach(context.Background(), host, Name, falconOpts()); err != nil {
		t.Fatal(err)
	}
	labtest.DetachAtEnd(t, host)
	labtest.AddVXLAN(t, host, "prgvx2", 77, 4790, "eth0")
	knob := "/sys/class/net/prgvx2/queues/rx-0/rps_cpus"
	// The agent reacts to the link's netlink event at once (milliseconds on an idle machine);
	// the window leaves room for a loaded one (CI beside builds: over 1 s once).
	added := time.Now()
	labtest.Eventually(t, 3*time.Second, "new VXLAN device steered", func() (bool, string) {
		v, err := netnsutil.ReadFileIn(host, knob)
		if err != nil || !cpuset.SameMask(v, cpuset.Mask(falconOpts().CPUs)) {
			return false, fmt.Sprintf("rps_cpus %q (%v)", v, err)
		}
		o, err := openPinned(host, false)
		if err != nil {
			return false, err.Error()
		}
		defer o.Close()
		var c falFalconCfg
		if err := o.PrgFalconCfg.Lookup(uint32(0), &c); err != nil || !slices.Contains(c.VxlanPorts[:], 4790) {
			return false, fmt.Sprintf("port set %v (%v)", c.VxlanPorts, err)
		}
		return true, ""
	})
	t.Logf("new VXLAN device steered %s after it was added", time.Since(added).Round(time.Millisecond))
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatal(err)
	}
	if v, _ := netnsutil.ReadFileIn(host, knob); !cpuset.SameMask(v, "0") {
		t.Errorf("detach left %s = %q, want 0 (as before)", knob, v)
	}
	for k, v := range labtest.RxKnobs(t, l, "rps_cpus") {
		if w, ok := before[k]; ok && w != v {
			t.Errorf("%s = %q after detach, was %q", k, v, w)
		}
	}
}
