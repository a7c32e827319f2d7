package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/lab/k8s"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

func newLabCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "lab",
		Short: "Build, inspect and remove container overlay topologies made of network namespaces",
		Long: `A lab is N hosts with K containers each, all network namespaces on this machine, joined by
an underlay that behaves like a NIC (GRO on, MTU 1500, receive optionally pinned to CPUs).

Styles:
  docker   Docker's overlay driver: vxlan0 (port 4789) and br0 in a per-host overlay namespace,
           a veth into each container. A received packet crosses three namespaces.
  flannel  flannel's VXLAN backend: flannel.1 (port 8472) and cni0 in the host namespace,
           a /24 per host, static routes, neighbours and FDB entries.
  linux    the dissertation's "Linux overlay": vxlan0 (port 4789) attached to eth0 in each host
           namespace with an overlay address (198.19.<host>.2/16, MTU 1450); applications run
           on the hosts and use it. No bridge, no veth, no containers: VXLAN's own cost.
           Datapath modes do not support it (attach says what it could not find).
  native   no overlay: applications run in the host namespaces (the baseline).
  k8s      a real Kubernetes cluster (kubelet, containerd, kube-proxy, flanneld, kube-router) with
           peregrine installed as its DaemonSet; one per machine, named "k8s": lab status/exec/down
           --name k8s, and "lab kubectl -- ARGS". scripts/setup-k8s.sh builds its binaries.

Namespaces are named prg-<lab>-h1, prg-<lab>-h1-c1, prg-<lab>-h1-ov, prg-<lab>-sw.

Tenants (--tenants N, docker style): each tenant has its own overlay on every host (namespace
h1-ov for tenant 1, h1-t2-ov for tenant 2, ...; its own vxlan0 with VNI vni+t-1 and br0) and its
own containers (h1-c1 for tenant 1 as without tenants, h1-t2-c1 for tenant 2) with the same
overlay addresses as the other tenants'. "lab up" checks every pair within each tenant and that
no tenant reaches another.
Addresses come from the RFC 2544 benchmarking range: underlay 198.18.0.0/24, overlay 198.19.0.0/16.`,
	}
	c.AddCommand(newLabUpCmd(), newLabDownCmd(), newLabStatusCmd(), newLabExecCmd(), newLabRealFlannelCmd(), newLabKubectlCmd())
	return c
}

func newLabUpCmd() *cobra.Command {
	var spec lab.Spec
	var file, rxCPUs, torCPUs string
	var noGRO, vethOffloads, asJSON bool
	var k8sUp *k8sUpFlags
	c := &cobra.Command{
		Use:   "up",
		Short: "Build a lab and prove every container reaches every other (TCP and UDP)",
		Example: `  peregrine lab up                                  # docker style, 2 hosts x 1 container
  peregrine lab up --style flannel --containers 2
  peregrine lab up --hosts 3                        # 3 hosts need the switch underlay (chosen for you)
  peregrine lab up --rx-cpus 0                      # receive of the underlay on CPU0, like a NIC IRQ
  peregrine lab up --file topo.yaml                 # flags given on the command line win over the file
  peregrine lab up --name b --style native          # a second lab beside the first
  peregrine lab up --name l --style linux           # hosts talk over vxlan0: lab exec h1 -- ping 198.19.2.2
  peregrine lab up --tor --rx-cpus 0                # a top-of-rack switch per host (EZPath: attach ezpath)
  peregrine lab up --style flannel --containers 2 --services --proxy-mode nftables
  peregrine lab up --tor --tenants 2                # two tenants, same addresses, isolated by VNI: h1-c1, h1-t2-c1
  peregrine lab up --style k8s --nodes 2            # a real Kubernetes cluster with peregrine's DaemonSet`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if spec.Style == "k8s" {
				return k8sUp.up(cmd, spec.Name, asJSON)
			}
			if file != "" {
				fromFile, err := lab.LoadSpec(file)
				if err != nil {
					return err
				}
				if err := overrideFileSpec(cmd.Flags(), &spec, fromFile); err != nil {
					return err
				}
			}
			if rxCPUs != "" {
				cpus, err := parseCPUList(rxCPUs)
				if err != nil {
					return fmt.Errorf("--rx-cpus: %w", err)
				}
				spec.RxCPUs = cpus
			}
			if torCPUs != "" {
				cpus, err := parseCPUList(torCPUs)
				if err != nil {
					return fmt.Errorf("--tor-cpus: %w", err)
				}
				spec.ToRCPUs = cpus
			}
			if noGRO {
				off := false
				spec.GRO = &off
			}
			if vethOffloads {
				off := false
				spec.WireFrames = &off
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			spec.Defaults()
			fmt.Fprintf(os.Stderr, "building lab %q\n", spec.Name)
			l, err := lab.Up(ctx, spec, stderrLog)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(os.Stdout, l)
			}
			fmt.Fprintf(os.Stderr, "lab %q is up and verified\n\n", spec.Name)
			printLab(l)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&spec.Name, "name", lab.DefaultName, "lab name (namespaces are prg-<name>-...)")
	f.StringVar(&spec.Style, "style", lab.StyleDocker, "docker, flannel, linux (VXLAN in the host namespace, no containers), native or k8s (a real Kubernetes cluster)")
	f.IntVar(&spec.Hosts, "hosts", 2, "number of hosts (at least 2)")
	f.IntVar(&spec.Containers, "containers", 1, "containers per host")
	f.StringVar(&spec.Underlay, "underlay", "", "direct (veth pair, 2 hosts) or switch (bridge namespace); default picks by host count")
	f.IntVar(&spec.MTU, "mtu", 1500, "underlay MTU; the overlay gets 50 bytes less")
	f.StringVar(&rxCPUs, "rx-cpus", "", "pin the underlay's receive processing to these CPUs with RPS, e.g. 0 or 0-1 (default: the sender's CPU, as veth does)")
	f.BoolVar(&noGRO, "no-gro", false, "leave GRO off on the underlay (veth without NAPI)")
	f.BoolVar(&spec.NAPIThread, "napi-thread", false, "with --rx-cpus: run the underlay's receive NAPI (GRO, the NIC stage) in a kernel thread pinned to those CPUs, as a NIC's IRQ affinity does (a veth otherwise polls its peer on the sending CPU)")
	f.BoolVar(&vethOffloads, "veth-offloads", false, "keep veth's TSO/checksum offload on the underlay: 64 KB super-packets cross unsegmented (faster, but no NIC delivers that)")
	f.StringVar(&file, "file", "", "YAML topology file (keys: name, style, hosts, containers, underlay, mtu, rx_cpus, gro, napi_thread, wire_frames, underlay_cidr, overlay_cidr, vni, vxlan_port, tor, tor_cpus, tenants, services, proxy_mode)")
	f.BoolVar(&asJSON, "json", false, "print the lab as JSON on stdout")
	f.BoolVar(&spec.ToR, "tor", false, "put a top-of-rack switch namespace (prg-<name>-torN, plain IP router) between each host and the underlay")
	f.StringVar(&torCPUs, "tor-cpus", "", "with --tor: CPUs the switches' receive runs on (RPS on their ports; default the last CPU)")
	f.BoolVar(&spec.IPv6, "ipv6", false, "flannel style: dual-stack pods, an IPv6 address each from "+lab.DefaultOverlayCIDR6+" (a /64 per host), routed as flannel's EnableIPv6 does but over flannel.1's IPv4 underlay; lab up checks every pair over IPv6 too")
	f.BoolVar(&spec.IPv6Underlay, "ipv6-underlay", false, "with --ipv6: carry the pods' IPv6 as real flannel does, on flannel-v6.1 over IPv6 addresses of the hosts' eth0 (from "+lab.DefaultUnderlayCIDR6+"); the fast path leaves that overlay to the normal path")
	f.BoolVar(&spec.Services, "services", false, "flannel style: write Kubernetes Services into every host namespace as kube-proxy does (default/one: 1 backend and NodePort "+strconv.Itoa(lab.ServiceNodePort)+", default/three: 3; ClusterIPs from "+lab.ServiceCIDR+"; with --ipv6 dual-stack, IPv6 ClusterIPs from "+lab.ServiceCIDR6+" in ip6tables or table ip6 kube-proxy, the IPv6 NodePort only with --ipv6-underlay); lab up checks a client on each host reaches each, over IPv6 too")
	f.StringVar(&spec.ProxyMode, "proxy-mode", "", "with --services: kube-proxy's mode whose rules to write, iptables (default) or nftables")
	k8sUp = addK8sUpFlags(f, &spec.ProxyMode)
	f.IntVar(&spec.Tenants, "tenants", 1, "docker style: tenants, each with its own overlay (VXLAN device, VNI vni+t-1, bridge) and containers h<i>-t<t>-c<j> using the same addresses as tenant 1's h<i>-c<j>")
	return c
}

// overrideFileSpec makes the topology file's spec the one the flags write into (*spec) and then
// sets every flag given on the command line again from its own text, so those win over the file.
// Re-applying the flags themselves needs no list of Spec fields to keep in step with the flags.
// (A slice-valued flag would append instead of replace; TestLabUpFlagsAreScalar keeps them out.)
func overrideFileSpec(f *pflag.FlagSet, spec *lab.Spec, fromFile lab.Spec) error {
	given := map[*pflag.Flag]string{}
	f.Visit(func(fl *pflag.Flag) { given[fl] = fl.Value.String() })
	*spec = fromFile
	for fl, v := range given {
		if err := fl.Value.Set(v); err != nil {
			return fmt.Errorf("--%s: %w", fl.Name, err)
		}
	}
	return nil
}

func newLabDownCmd() *cobra.Command {
	var name string
	var all bool
	c := &cobra.Command{
		Use:   "down",
		Short: "Remove a lab: its processes, namespaces, links, pinned objects and records",
		Example: `  peregrine lab down              # the lab named "lab"
  peregrine lab down --name b
  peregrine lab down --name k8s   # the Kubernetes cluster (lab up --style k8s)
  peregrine lab down --all        # every lab (prg- prefix), e.g. after a crash or kill -9; never an attachment elsewhere`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lab.Preflight(); err != nil {
				return err
			}
			if all {
				if err := lab.DownAll(stderrLog, datapath.ForgetNamespaces, downK8s); err != nil {
					return err
				}
				fmt.Fprintln(os.Stderr, "removed every lab namespace and link, with their attachments, pins and records (attachments to other namespaces are kept)")
				return nil
			}
			if name == k8s.Name {
				if err := downK8s(stderrLog); err != nil {
					return err
				}
				fmt.Fprintln(os.Stderr, "k8s lab removed")
				return nil
			}
			err := lab.Down(name, stderrLog, datapath.ForgetNamespaces)
			if errors.Is(err, lab.ErrNotUp) {
				fmt.Fprintf(os.Stderr, "lab %q is not up: nothing to remove\n", name)
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "lab %q removed\n", name)
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", lab.DefaultName, "lab to remove")
	c.Flags().BoolVar(&all, "all", false, "remove everything peregrine made, whatever lab it belongs to")
	return c
}

func newLabStatusCmd() *cobra.Command {
	var name string
	var asJSON bool
	c := &cobra.Command{
		Use:   "status",
		Short: "Show a lab's hosts and containers with their namespaces, devices and addresses",
		Example: `  peregrine lab status
  peregrine lab status --json | jq -r '.containers[].addr'
  peregrine lab status --name k8s                   # the Kubernetes cluster: nodes, daemons, pods`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lab.Preflight(); err != nil {
				return err
			}
			if name == k8s.Name {
				return k8sStatus(asJSON)
			}
			l, err := lab.Status(name)
			if err != nil {
				if others := lab.Names(); errors.Is(err, lab.ErrNotUp) && len(others) > 0 {
					return fmt.Errorf("%w; labs present: %s", err, strings.Join(others, ", "))
				}
				return err
			}
			if asJSON {
				return printJSON(os.Stdout, l)
			}
			printLab(l)
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", lab.DefaultName, "lab to show")
	c.Flags().BoolVar(&asJSON, "json", false, "JSON for machines: every node with namespace, devices and addresses")
	return c
}

func printLab(l *lab.Lab) {
	s := l.Spec
	rx := "sender's CPU (no RPS)"
	if len(s.RxCPUs) > 0 {
		rx = "CPUs " + cpuset.Format(s.RxCPUs)
		if s.NAPIThread {
			rx += " (NAPI thread and RPS)"
		}
	}
	wire := "wire-like frames (tx offload off)"
	if s.WireFrames != nil && !*s.WireFrames {
		wire = "veth offloads (64 KB super-packets)"
	}
	fmt.Printf("lab %s: style %s, %d hosts x %d containers, %s underlay, MTU %d/%d, GRO %v, %s, rx on %s\n",
		s.Name, s.Style, s.Hosts, s.Containers, s.Underlay, s.MTU, s.OverlayMTU(), *s.GRO, wire, rx)
	tenants := s.TenantCount() > 1
	if tenants {
		fmt.Printf("kernel %s, %d CPUs, %d tenants (VNI %d-%d), VXLAN port %d\n\n", l.Kernel, l.CPUs, s.TenantCount(), s.TenantVNI(1), s.TenantVNI(s.TenantCount()), s.VXLANPort)
	} else {
		fmt.Printf("kernel %s, %d CPUs, VNI %d, VXLAN port %d\n\n", l.Kernel, l.CPUs, s.VNI, s.VXLANPort)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	if tenants {
		fmt.Fprintln(tw, "NODE\tROLE\tTENANT\tNAMESPACE\tADDRESS\tDEVICES")
	} else {
		fmt.Fprintln(tw, "NODE\tROLE\tNAMESPACE\tADDRESS\tDEVICES")
	}
	nodes := append(append(append(append([]lab.Node{}, l.Hosts...), l.Overlays...), l.Containers...), l.ToRs...)
	if l.Switch != nil {
		nodes = append(nodes, *l.Switch)
	}
	for _, n := range nodes {
		var devs []string
		for _, d := range n.Devices {
			desc := d.Name + "(" + d.Kind
			if d.Stage != "" && d.Stage != d.Kind {
				desc += "," + d.Stage
			}
			if d.Master != "" {
				desc += ",on " + d.Master
			}
			devs = append(devs, desc+")")
		}
		if tenants {
			tenant := "-"
			if n.Tenant > 0 {
				tenant = fmt.Sprint(n.Tenant)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, tenant, n.Netns, n.Addr, strings.Join(devs, " "))
			continue
		}
		addr := n.Addr
		if n.Addr6 != "" { // dual-stack (--ipv6)
			addr += "," + n.Addr6
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, n.Netns, addr, strings.Join(devs, " "))
	}
	tw.Flush()
	printServices(l)
}

// printServices lists the lab's Services, as `kubectl get svc` and its endpoints would.
func printServices(l *lab.Lab) {
	if len(l.Services) == 0 {
		return
	}
	fmt.Printf("\nServices (kube-proxy %s mode rules in every host namespace):\n", l.Spec.ProxyMode)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tCLUSTER-IP\tPORT\tBACKENDS")
	for _, sv := range l.Services {
		var bs []string
		for _, be := range sv.Backends {
			bs = append(bs, be.Node+"="+be.Target())
		}
		port := fmt.Sprintf("%d/%s", sv.Port, sv.Protocol)
		if sv.NodePort != 0 { // as kubectl prints it: port:nodePort/protocol
			port = fmt.Sprintf("%d:%d/%s", sv.Port, sv.NodePort, sv.Protocol)
		}
		ip := sv.ClusterIP
		if sv.ClusterIP6 != "" { // dual-stack, as kubectl's CLUSTER-IP column lists spec.clusterIPs
			ip += "," + sv.ClusterIP6
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sv.Name, ip, port, strings.Join(bs, " "))
	}
	tw.Flush()
}

func newLabExecCmd() *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "exec NODE -- COMMAND [ARGS...]",
		Short: "Run a command inside a lab host, container, overlay or switch namespace",
		Example: `  peregrine lab exec h1-c1 -- ip addr
  peregrine lab exec h1-t2-c1 -- ping -c1 198.19.2.2   # tenant 2's h1-c1 pings tenant 2's h2-c1
  peregrine lab exec h2 -- ethtool -k eth0
  peregrine lab exec h2-c1 -- iperf3 -s -1
  peregrine lab exec --name k8s n2 -- peregrine status   # on a Kubernetes node (its net and mount namespace)`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == k8s.Name {
				return k8sExec(args[0], args[1:])
			}
			l, err := lab.Status(name)
			if err != nil {
				return err
			}
			n, err := l.Node(args[0])
			if err != nil {
				return err
			}
			x := netnsutil.Command(context.Background(), n.Netns, args[1:]...)
			x.Stdin, x.Stdout, x.Stderr = os.Stdin, os.Stdout, os.Stderr
			if err := x.Run(); err != nil {
				var ee interface{ ExitCode() int }
				if errors.As(err, &ee) {
					return fmt.Errorf("%s exited with status %d", args[1], ee.ExitCode())
				}
				return err
			}
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", lab.DefaultName, "lab the node belongs to")
	return c
}

// parseCPUList parses "0,2-3" into CPU numbers (cpuset.Parse: ascending, distinct).
func parseCPUList(s string) ([]int, error) { return cpuset.Parse(s) }

// downK8s is the k8s cluster's part of `lab down --all`, run before the namespace sweep would
// pull the namespaces from under its daemons and leave their mounts, cgroups and sysctls.
// It forgets the attachments to the cluster's nodes, as lab.Down does for the other labs.
func downK8s(log lab.Logf) error { return k8s.Down(log, datapath.ForgetNamespaces) }
