package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// testbed is the lab of one config, with its mode attached.
type testbed struct {
	cfg      Config
	lab      *lab.Lab // nil for given namespaces
	given    bool
	attached []string // host namespaces with the mode attached
	pair     pair
	stages   map[string]string // "netns/device" -> stage, receiving host's namespaces only
	offloads map[string]map[string]bool
	knobs    map[string]string
}

// labName gives each config of this process its own lab: "b<pid>x<i>" fits the 12-char limit.
func labName(i int) string { return fmt.Sprintf("b%dx%d", os.Getpid()%100000, i) }

func setupTestbed(ctx context.Context, i int, cfg Config, o *Options, log func(string, ...any)) (*testbed, error) {
	spec := lab.Spec{Name: labName(i), Style: cfg.Style, Hosts: 2, Containers: o.Scenario.containers(), RxCPUs: o.RxCPUs, ToR: o.ToR, NAPIThread: o.NAPIThread}
	log("building lab %s for %s", spec.Name, cfg.Name())
	l, err := lab.Up(ctx, spec, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name(), err)
	}
	tb := &testbed{cfg: cfg, lab: l, knobs: map[string]string{}}
	for _, spec := range cfg.Stack {
		for _, h := range l.Hosts {
			opts := datapath.Options{KeepUnderlay: len(o.RxCPUs) > 0, Extra: mergeExtra(o.modeExtra(spec.Mode), spec.Extra)}
			if spec.Mode == "ezpath" {
				opts.Extra["lab"] = l.Spec.Name // the switches it programs are the lab's
			}
			st, err := datapath.Attach(ctx, h.Netns, spec.Mode, opts)
			if err != nil {
				tb.teardown()
				return nil, fmt.Errorf("%s: attach %s: %w", cfg.Name(), spec.Mode, err)
			}
			tb.attached = appendUnique(tb.attached, h.Netns)
			for _, k := range st.Knobs {
				tb.knobs[k.Netns+":"+k.Path] = k.New
			}
		}
	}
	eps := l.Endpoints()
	sender, receiver := eps[0], eps[len(eps)-1]
	senderHost, recvHost := sender.Netns, receiver.Name
	if sender.Host != "" {
		h, _ := l.Node(sender.Host)
		senderHost = h.Netns
		recvHost = receiver.Host
	}
	tb.pair = pair{lab: l, sender: sender, receiver: receiver, senderHost: senderHost, appCPUs: o.AppCPUs, senderCPUs: o.SenderCPUs}
	if err := tb.pair.setBackground(o.Scenario.Background); err != nil {
		tb.teardown()
		return nil, err
	}
	tb.stages = map[string]string{}
	// With --tor the receiving rack's switch is a stage too ("tor"): its softirq time is the
	// switch's work, which real silicon would do (receive cost minus it is the host's).
	for _, set := range [][]lab.Node{l.Hosts, l.Overlays, l.Containers, l.ToRs} {
		for _, n := range set {
			if n.Name != recvHost && n.Host != recvHost {
				continue // the stage chart is about the receive path of the measured flow
			}
			for _, d := range n.Devices {
				if d.Stage != "" {
					tb.stages[n.Netns+"/"+d.Name] = d.Stage
				}
			}
		}
	}
	tb.offloads = readOffloads(ctx, l, recvHost)
	return tb, nil
}

func (tb *testbed) teardown() error {
	if tb.given {
		return nil // not ours to remove
	}
	var errs []error
	for _, ns := range tb.attached {
		if _, err := datapath.Detach(context.Background(), ns, ""); err != nil {
			errs = append(errs, err)
		}
	}
	if err := lab.Down(tb.lab.Spec.Name, nil, datapath.ForgetNamespaces); err != nil && !errors.Is(err, lab.ErrNotUp) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// namespaces are every namespace of the testbed's lab.
func (tb *testbed) namespaces() []string {
	if tb.given {
		return []string{tb.pair.sender.Netns, tb.pair.receiver.Netns}
	}
	nss, _ := netnsutil.List(lab.NsPrefix(tb.lab.Spec.Name))
	return nss
}

// offloadFeatures are the features recorded for every device on the receive path.
var offloadFeatures = map[string]string{
	"generic-receive-offload":      "gro",
	"generic-segmentation-offload": "gso",
	"tcp-segmentation-offload":     "tso",
	"rx-checksumming":              "rx-csum",
	"tx-checksumming":              "tx-csum",
	"rx-gro-list":                  "gro-list",
	"rx-udp-gro-forwarding":        "udp-gro-fwd",
}

// readOffloads records the offload state of every device of the receiving host: its own
// namespace, its overlay namespace (docker) and its containers.
func readOffloads(ctx context.Context, l *lab.Lab, recvHost string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	// With --tor the receiving rack's switch is a stage too ("tor"): its softirq time is the
	// switch's work, which real silicon would do (receive cost minus it is the host's).
	for _, set := range [][]lab.Node{l.Hosts, l.Overlays, l.Containers, l.ToRs} {
		for _, n := range set {
			if n.Name != recvHost && n.Host != recvHost {
				continue
			}
			for _, d := range n.Devices {
				txt, err := netnsutil.Run(ctx, n.Netns, "ethtool", "-k", d.Name)
				if err != nil {
					continue
				}
				out[n.Name+"/"+d.Name] = parseEthtoolK(txt)
			}
		}
	}
	return out
}

func parseEthtoolK(txt string) map[string]bool {
	f := map[string]bool{}
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if short, ok := offloadFeatures[k]; ok {
			f[short] = strings.HasPrefix(strings.TrimSpace(v), "on")
		}
	}
	return f
}

// mergeExtra lays a config's own mode options over the run-wide ones.
func mergeExtra(base, over map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}
