package falcon

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
	"github.com/peregrine-net/peregrine/internal/workload/inject"
)

// --split auto: a flood that saturates the NIC stage's core turns the GRO split on; quiet
// turns it off again; detach leaves nothing.
func TestAutoSplitFollowsLoad(t *testing.T) {
	testutil.RequireRoot(t)
	if numOnline() < 2 {
		t.Skip("needs 2 CPUs")
	}
	l := labUp(t, lab.Spec{Name: "tfas", Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
	host := labtest.NS(l, "h2")
	o := falconOpts()
	o.Extra["split"] = "auto"
	o.Extra["split_cpus"] = "1"
	if _, err := datapath.Attach(context.Background(), host, "falcon", o); err != nil {
		t.Fatal(err)
	}
	labtest.DetachAtEnd(t, host)
	splitOn := func() bool {
		ms, err := readModeStateOf(host)
		return err == nil && len(ms.SplitPins) > 0
	}
	if splitOn() {
		t.Fatal("auto split attached before any load")
	}
	spec := l.Spec
	cpu := 1
	flood := inject.Config{
		Netns: labtest.NS(l, "h1"), Device: "eth0", DstMAC: inject.MAC(spec.UnderlayMAC(2)),
		SrcIP: spec.HostAddr(1).Addr(), DstIP: spec.HostAddr(2).Addr(), DstPort: uint16(spec.VXLANPort), VNI: uint32(spec.VNI),
		InnerSrcMAC: inject.MAC(spec.ContainerMAC(1, 1)), InnerDstMAC: inject.MAC(spec.ContainerMAC(2, 1)),
		InnerSrcIP: netip.MustParseAddr(spec.ContainerAddr(1, 1).Addr().String()), InnerDstIP: spec.ContainerAddr(2, 1).Addr(),
		InnerDstPort: 9, PayloadSize: 64, Flows: 4, Duration: 6 * time.Second, CPU: &cpu,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := inject.Run(ctx, flood); done <- err }()
	labtest.Eventually(t, 5*time.Second, "auto split to attach under a flood", func() (bool, string) { return splitOn(), "split off" })
	cancel()
	<-done
	labtest.Eventually(t, 8*time.Second, "auto split to detach once quiet", func() (bool, string) { return !splitOn(), "split on" })
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatal(err)
	}
}
