package prism

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The mode's own commands, `peregrine prism ...` (datapath.Commander): list and change the
// rules of live attachments, and sync their endpoint maps.

const ruleSyntax = `A rule is "key=value" criteria separated by spaces or commas; every criterion given must
hold, and the first matching rule counts the packet. Keys:
  proto    tcp, udp, sctp, icmp, icmpv6 or a number 0-255
  sport    source port or range lo-hi (tcp, udp, sctp)
  dport    destination port or range
  src/dst  inner source/destination address or CIDR, IPv4 or IPv6
  dscp     0-63 or a name: ef, af11..af43, cs0..cs7
  family   ipv4 or ipv6
"all" alone makes everything high priority. IP fragments never match port criteria (only the
first fragment carries ports; all fragments of a datagram stay on one path).`

// Commands is the `peregrine prism` command tree.
func (mode) Commands(host datapath.CLIHost) *cobra.Command {
	c := &cobra.Command{
		Use:   "prism",
		Short: "List and change the high-priority rules of mode prism, live",
		Long: `Mode prism (PRISM's sync mode) classifies every decapsulated overlay packet at the VXLAN
device by its inner headers. Packets that match a rule are high priority (HP): they are handed
with bpf_redirect_peer straight to the container's eth0, past the bridge and the veth backlog
stage, with the headers the normal path would give them. Everything else is untouched.

Topology requirements: the VXLAN device and the bridge-side veth of each container are in the
same network namespace, the container end in another one (docker overlay namespaces and
flannel's cni0 qualify). HP packets skip the bridge and, for flannel, the host's iptables
FORWARD chain and conntrack: policies there do not apply to HP flows.

` + ruleSyntax,
	}
	c.AddCommand(newRulesCmd(host), newAddCmd(host), newDelCmd(host), newSyncCmd(host))
	return c
}

func newRulesCmd(host datapath.CLIHost) *cobra.Command {
	var asJSON, endpoints bool
	var resolve func() ([]string, error)
	c := &cobra.Command{
		Use:   "rules",
		Short: "List the rules with their HP packet counters",
		Example: `  sudo peregrine prism rules --lab
  sudo peregrine prism rules --netns prg-lab-h2 --endpoints`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			targets, err := resolve()
			if err != nil {
				return err
			}
			var views []*View
			for _, t := range targets {
				v, err := Inspect(t)
				if err != nil {
					return err
				}
				views = append(views, v)
			}
			if asJSON {
				return host.PrintJSON(os.Stdout, views)
			}
			for _, v := range views {
				fmt.Printf("%s:\n", netnsutil.Label(v.Target))
				tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "  ID\tRULE\tHP PACKETS\tHP BYTES")
				for _, r := range v.Rules {
					fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\n", r.ID, r.Rule, r.Packets, r.Bytes)
				}
				tw.Flush()
				if len(v.Rules) == 0 {
					fmt.Println("  (no rules: nothing is high priority; add some with `peregrine prism add`)")
				}
				fmt.Print(v.Format())
				if endpoints {
					for _, e := range v.Endpoints {
						state := "held"
						if e.Gone {
							state = "GONE (HP packets dropped)"
						} else if !e.Held {
							state = "STALE (veth unregistered; HP packets dropped)"
						}
						fmt.Printf("    endpoint %-28s veth ifindex %-4d mac %s %s\n", e.Addr, e.Ifindex, e.MAC, state)
					}
				}
			}
			return nil
		},
	}
	resolve = host.AddTargetFlags(c)
	c.Flags().BoolVar(&asJSON, "json", false, "JSON for machines")
	c.Flags().BoolVar(&endpoints, "endpoints", false, "also list the endpoint map (container address -> veth)")
	return c
}

func newAddCmd(host datapath.CLIHost) *cobra.Command {
	var file string
	var resolve func() ([]string, error)
	var replace bool
	c := &cobra.Command{
		Use:   "add RULE...",
		Short: "Add high-priority rules (or replace all of them with --replace), live",
		Long:  "Add rules to an attached prism without detaching; the change is atomic for every packet.\n\n" + ruleSyntax,
		Example: `  sudo peregrine prism add --lab "proto=tcp dport=11211"
  sudo peregrine prism add --lab "dst=198.19.2.0/24 dscp=ef" "proto=udp sport=5000-5999"
  sudo peregrine prism add --lab --replace --file hp.rules`,
		RunE: func(cmd *cobra.Command, args []string) error {
			text := strings.Join(args, ";")
			if file != "" {
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				text += "\n" + string(b)
			}
			if _, err := ParseRules(text); err != nil {
				return err
			}
			if !replace && strings.TrimSpace(text) == "" {
				return errors.New("no rule given")
			}
			change := AddRules
			if replace {
				change = ReplaceRules
			}
			return eachTarget(resolve, func(t string) (string, error) {
				rs, err := change(t, text)
				return fmt.Sprintf("%d rules installed", len(rs)), err
			})
		},
	}
	resolve = host.AddTargetFlags(c)
	c.Flags().StringVar(&file, "file", "", "read rules from a file (one per line, '#' comments)")
	c.Flags().BoolVar(&replace, "replace", false, "install exactly the rules given (unchanged rules keep their counters)")
	return c
}

func newDelCmd(host datapath.CLIHost) *cobra.Command {
	return changeEachCmd(host, &cobra.Command{
		Use:   "del ID|RULE...",
		Short: "Delete rules by ID or by their text, live",
		Example: `  sudo peregrine prism del --lab 2
  sudo peregrine prism del --lab "proto=tcp dport=11211"`,
		Args: cobra.MinimumNArgs(1),
	}, func(t string, args []string) (string, error) {
		ids, err := DelRules(t, args)
		return fmt.Sprintf("deleted rules %v", ids), err
	})
}

func newSyncCmd(host datapath.CLIHost) *cobra.Command {
	return changeEachCmd(host, &cobra.Command{
		Use:   "sync",
		Short: "Bring the endpoint map up to date now (the agent does it on every link change)",
		Args:  cobra.NoArgs,
	}, func(t string, _ []string) (string, error) {
		a, u, g, err := Sync(t)
		return fmt.Sprintf("endpoints %d added, %d updated, %d gone", a, u, g), err
	})
}

// changeEachCmd completes c into a command that takes the target flags and makes change, with
// the command's arguments, in each target namespace (eachTarget).
func changeEachCmd(host datapath.CLIHost, c *cobra.Command, change func(ns string, args []string) (string, error)) *cobra.Command {
	resolve := host.AddTargetFlags(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		return eachTarget(resolve, func(t string) (string, error) { return change(t, args) })
	}
	return c
}

// eachTarget runs change in each namespace resolve names, in order, and prints what it did there
// after the namespace's label; the first error stops it, prefixed with the namespace it
// happened in (the namespaces before it keep their change).
func eachTarget(resolve func() ([]string, error), change func(ns string) (done string, err error)) error {
	targets, err := resolve()
	if err != nil {
		return err
	}
	for _, t := range targets {
		done, err := change(t)
		if err != nil {
			return fmt.Errorf("%s: %w", netnsutil.Label(t), err)
		}
		fmt.Printf("%s: %s\n", netnsutil.Label(t), done)
	}
	return nil
}
