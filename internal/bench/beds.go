package bench

import (
	"context"
	"slices"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/results"
)

// bed is a testbed with the pair the scenario measures on it.
type bed struct {
	*testbed.Testbed
	pair pair
}

// buildBeds builds the testbed of every config (or wraps the given namespaces) and records the
// configs in run. Every bed built so far is in beds, also on failure, for the caller to tear down.
func (o *Options) buildBeds(ctx context.Context, run *results.Run, beds *[]bed) error {
	if g := o.Given; g != nil {
		tb := testbed.Existing(g.name(), g.ClientNS, g.ServerNS, g.ServerAddr)
		*beds = append(*beds, o.bedOf(tb))
		run.Configs = append(run.Configs, results.Config{Name: tb.Config, Style: StyleGiven, Mode: "as found", Placement: results.PlacementUnknown})
		return nil
	}
	var k8s *testbed.K8s
	for i, c := range o.Configs {
		if testbed.IsK8s(c.Style) && k8s == nil {
			var err error
			if k8s, err = testbed.OpenK8s(ctx, o.k8sOptions(), o.Logf); err != nil {
				return err
			}
		}
		spec := testbed.Spec{K8s: k8s, Index: i, Config: c.Name(), Style: c.Style, Containers: o.Scenario.containers(), RxCPUs: o.RxCPUs,
			ModeCPUs: o.ModeCPUs, ToR: o.ToR, NAPIThread: o.NAPIThread, Background: o.Scenario.Background != "",
			SameNode: o.Scenario.SameNode, IPv6: o.Scenario.IPv6, IPv6Underlay: o.Scenario.IPv6Underlay}
		if o.Scenario.ViaService {
			spec.ProxyMode = o.Scenario.ProxyMode
		}
		var stack []string
		for _, m := range c.Stack {
			spec.Stack = append(spec.Stack, testbed.Attach{Mode: m.Mode, Extra: mergeExtra(o.modeExtra(m.Mode, c.Style), m.Extra)})
			stack = append(stack, m.Mode)
		}
		tb, err := testbed.Up(ctx, spec, o.Logf)
		if err != nil {
			return err
		}
		*beds = append(*beds, o.bedOf(tb))
		if !slices.Contains(run.Lab.Styles, c.Style) {
			run.Lab.Styles = append(run.Lab.Styles, c.Style)
		}
		pl, note := placementOf(c.Name(), stack)
		if note != "" {
			run.Notes = append(run.Notes, note)
		}
		run.Configs = append(run.Configs, results.Config{Name: c.Name(), Style: c.Style, Mode: c.Mode, Knobs: tb.Knobs, Offloads: tb.Offloads, Placement: pl})
	}
	return nil
}

// bedOf pairs a testbed with the run's CPU arrangement.
func (o *Options) bedOf(tb *testbed.Testbed) bed {
	return bed{Testbed: tb, pair: pair{lab: tb.Lab, sender: tb.Sender, receiver: tb.Receiver, senderHost: tb.SenderHost,
		appCPUs: o.AppCPUs, senderCPUs: o.SenderCPUs, bgSender: tb.BGSender, bgReceiver: tb.BGReceiver,
		connect: tb.Connect, serverPort: tb.ServerPort, nginxPort: tb.NginxPort}}
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
