package prism

import (
	"fmt"
	"os"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// napiKnobs plans napi_threaded: every underlay device's NAPI (the NIC stage, which HP and bulk
// traffic share up to the VXLAN device where prism's redirect starts) polled by a kernel thread
// instead of in softirq context (/sys/class/net/DEV/threaded = 1). A softirq runs ahead of every
// task, so a burst of bulk frames delays an HP application (even a real-time one) by the whole
// poll; a NAPI thread is a task the scheduler may preempt for it. The framework reads the old
// value first and writes it back on detach, which also takes the thread's packets away (a thread
// that polls no NAPI is idle, whatever its priority).
//
// What a stock 6.18 kernel does not offer here, and why this is the only NAPI knob: threaded
// busy polling (threaded=2) arrived after 6.18's netdev_napi_threaded {disabled, enabled};
// irq-suspend-timeout and napi_defer_hard_irqs/gro_flush_timeout defer a device's hard IRQ for
// an application that busy-polls through epoll with prefer_busy_poll, and a veth raises no hard
// IRQ (its peer's transmit schedules the NAPI) and the measured applications do not busy-poll;
// on a latency class the deferral only holds frames longer. Priority per NAPI thread cannot
// separate the classes either: HP and bulk frames share the underlay's one NAPI.
func napiKnobs(t *datapath.Topology) ([]datapath.Knob, error) {
	nics := t.ByStage(datapath.StageNIC)
	if len(nics) == 0 {
		return nil, fmt.Errorf("prism: napi_threaded needs the underlay device behind the VXLAN devices, and discovery found none: pass --underlay")
	}
	var ks []datapath.Knob
	for _, d := range nics {
		p := "/sys/class/net/" + d.Name + "/threaded"
		err := netnsutil.WithSysfs(d.Netns, func() error {
			_, err := os.Stat(p)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("prism: napi_threaded: %s has no %s (the kernel lacks threaded NAPI, 5.12+): %w", d, p, err)
		}
		ks = append(ks, datapath.Knob{Netns: d.Netns, Path: p, New: "1"})
	}
	return ks, nil
}
