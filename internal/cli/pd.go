package cli

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/pipedevice"
	"github.com/spf13/cobra"
)

func newPdCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pd",
		Short: "PipeDevice: an intra-host channel between containers over isolated shared-memory rings",
		Long: `PipeDevice moves data between containers on one host through per-connection rings that a
copy engine (a pinned daemon thread; the paper used an FPGA) fills, instead of TCP over a bridge
and veths. Programs use libpd (libpd/pd.h, bin/libpd.so) or the Go client; the daemon owns all
memory and hands each process only its own sockets' rings.`,
		Example: `  # the daemon (foreground; SIGTERM stops it and frees everything)
  sudo peregrine pd daemon --engine-cpus 1

  # what it holds
  peregrine pd status

  # measure: a server and a client (in two containers of a lab, or anywhere on the host)
  peregrine pd perf server --bind 127.0.0.1:5201 &
  peregrine pd perf client --connect 127.0.0.1:5201 --size 65536 --time 5s`,
	}
	cmd.AddCommand(newPdDaemonCmd(), newPdStatusCmd(), newPdPerfCmd())
	return cmd
}

func newPdDaemonCmd() *cobra.Command {
	var socket, cpus, mode string
	var ring, pool int
	var spin time.Duration
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "Run the PipeDevice daemon in the foreground",
		Long: `Runs the PipeDevice driver: the connection table, the rings (one memfd each, on 2 MiB
hugepages when reserved, else normal pages; "pd status" says which), per-core submission and
completion queues, and the copy engine threads.

--mode engine (default): the engine copies every byte from the sender's send ring into the
receiver's ring (the paper's design, with a CPU in place of the FPGA's DMA).
--mode direct: a sender's pd_malloc buffers are carved from its connected peer's receive ring
(memory shared by those two only), so pd_send publishes a descriptor and nothing is copied.

Containers reach the daemon through its unix socket: in another mount namespace, bind-mount the
socket's directory into the container (e.g. docker run -v /run/peregrine:/run/peregrine).
Callers are told apart by their network namespace and may bind only its addresses.`,
		Example: `  sudo peregrine pd daemon
  sudo peregrine pd daemon --engine-cpus 1 --mode direct
  sudo peregrine pd daemon --socket /tmp/pd.sock --ring 65536   # small rings for many connections`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := pipedevice.Config{Socket: socket, Ring: ring, Pool: pool, Spin: spin}
			switch mode {
			case "engine":
			case "direct":
				cfg.Direct = true
			default:
				return fmt.Errorf("--mode %q: want engine or direct", mode)
			}
			if cpus != "" {
				list, err := cpuset.Parse(cpus)
				if err != nil {
					return fmt.Errorf("--engine-cpus: %w", err)
				}
				if err := cpuset.CheckOnline(list); err != nil {
					return fmt.Errorf("--engine-cpus: %w", err)
				}
				cfg.EngineCPUs = list
			}
			d, err := pipedevice.NewDaemon(cfg)
			if err != nil {
				return err
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			go func() {
				<-sig
				d.Close()
			}()
			st := d.Status()
			stderrLog("pd daemon: %s mode, socket %s, engine CPUs %v, ring %d B, pool %d B", st.Mode, st.Socket, cfg.EngineCPUs, st.RingBytes, st.PoolBytes)
			stderrLog("hugepages: %s", st.Hugepages)
			err = d.Serve()
			d.Close()
			return err
		},
	}
	cmd.Flags().StringVar(&socket, "socket", pipedevice.DefaultSocket, "unix socket to serve")
	cmd.Flags().StringVar(&cpus, "engine-cpus", "", "CPUs for the copy engines, one pinned thread each (e.g. 1 or 2-3); empty: one unpinned engine")
	cmd.Flags().StringVar(&mode, "mode", "engine", "engine (copy) or direct (senders write into the peer's ring)")
	cmd.Flags().IntVar(&ring, "ring", pipedevice.DefaultRing, "receive ring bytes per socket (power of two; a client may ask otherwise with PD_RING_SIZE)")
	cmd.Flags().IntVar(&pool, "pool", pipedevice.DefaultPool, "send ring (pd_malloc pool) bytes per process (power of two)")
	cmd.Flags().DurationVar(&spin, "spin", 50*time.Microsecond, "how long an idle engine keeps polling before it sleeps on its doorbell")
	return cmd
}

func newPdStatusCmd() *cobra.Command {
	var socket string
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "status",
		Short:   "Show what the PipeDevice daemon holds",
		Example: "  peregrine pd status\n  peregrine pd status --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			body, err := pipedevice.DaemonStatus(socket)
			if err != nil {
				return err
			}
			var st pipedevice.Status
			if err := json.Unmarshal(body, &st); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), st)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "socket      %s\nmode        %s\nengine CPUs %v\nrings       %d on hugepages, %d on normal pages\nhugepages   %s\n",
				st.Socket, st.Mode, st.Engines, st.RingsHuge, st.RingsNormal, st.Hugepages)
			fmt.Fprintf(w, "moved       %d B copied, %d B published in place, %d entries (%d failed)\n", st.BytesCopied, st.BytesPublish, st.Entries, st.FailedEntries)
			fmt.Fprintf(w, "%-8s %-22s %s\n", "PID", "NETNS", "SOCKETS")
			for _, c := range st.Clients {
				fmt.Fprintf(w, "%-8d %-22s %d\n", c.PID, c.Netns, c.Sockets)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", pipedevice.DefaultSocket, "daemon socket")
	cmd.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	return cmd
}

func newPdPerfCmd() *cobra.Command {
	var cfg pipedevice.PerfConfig
	var addr string
	var asJSON bool
	run := func(role string) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil || !ap.Addr().Is4() {
				return fmt.Errorf("address %q: want IPv4:port", addr)
			}
			cfg.Addr = ap
			if cfg.Size <= 0 || cfg.Size > 64<<20 {
				return fmt.Errorf("--size %d: want 1 B to 64 MiB", cfg.Size)
			}
			if cfg.Conns <= 0 || cfg.Conns > 8192 {
				return fmt.Errorf("--conns %d: want 1..8192", cfg.Conns)
			}
			if cfg.Latency && cfg.Conns != 1 {
				return fmt.Errorf("--latency measures one connection: drop --conns")
			}
			var res *pipedevice.PerfResult
			ready := func() { stderrLog("%s server listening on %v", cfg.Transport, ap) }
			switch {
			case cfg.Transport == "pd" && role == "server":
				res, err = pipedevice.PerfServerPD(cfg, ready)
			case cfg.Transport == "pd":
				res, err = pipedevice.PerfClientPD(cfg)
			case cfg.Transport == "tcp" && role == "server":
				res, err = pipedevice.PerfServerTCP(cfg, ready, nil)
			case cfg.Transport == "tcp":
				res, err = pipedevice.PerfClientTCP(cfg, nil)
			default:
				return fmt.Errorf("--transport %q: want pd or tcp", cfg.Transport)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), res)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s %s: %d conns, %d B messages, %.2f s, %d B, %.2f Gbit/s, %.2f CPU s\n",
				res.Transport, res.Role, res.Conns, res.Size, res.Seconds, res.Bytes, res.Gbps, res.CPUSeconds)
			if res.RTTsamples > 0 {
				fmt.Fprintf(w, "round trip: p50 %.1f us, p99 %.1f us (%d samples)\n", res.RTTp50us, res.RTTp99us, res.RTTsamples)
			}
			return nil
		}
	}
	cmd := &cobra.Command{
		Use:   "perf",
		Short: "iperf-like measurement over PipeDevice or kernel TCP (both ends)",
		Long: `Measures throughput (a stream over --conns connections for --time) or latency (--latency:
ping-pong of --size bytes, round-trip percentiles) between a server and a client. --transport pd
goes through the PipeDevice daemon; --transport tcp through kernel TCP (the baseline, and the
sockmap shortcut when "peregrine bench" attaches it). The server serves one client run and exits.`,
		Example: `  peregrine pd perf server --bind 127.0.0.1:5201 &
  peregrine pd perf client --connect 127.0.0.1:5201 --size 65536 --time 5s --json

  # latency at 64 B, kernel TCP between two lab containers
  sudo peregrine lab exec h1-c2 -- peregrine pd perf server --transport tcp --bind 0.0.0.0:5201 --latency &
  sudo peregrine lab exec h1-c1 -- peregrine pd perf client --transport tcp --connect 198.19.1.3:5201 --latency --size 64`,
	}
	server := &cobra.Command{Use: "server", Short: "Serve one perf run", Args: cobra.NoArgs, RunE: run("server")}
	client := &cobra.Command{Use: "client", Short: "Run the measuring end", Args: cobra.NoArgs, RunE: run("client")}
	server.Flags().StringVar(&addr, "bind", "127.0.0.1:5201", "address to listen on")
	client.Flags().StringVar(&addr, "connect", "127.0.0.1:5201", "server address")
	client.Flags().DurationVar(&cfg.Duration, "time", 5*time.Second, "throughput run length")
	client.Flags().IntVar(&cfg.Count, "count", 5000, "round trips (--latency)")
	for _, c := range []*cobra.Command{server, client} {
		c.Flags().StringVar(&cfg.Transport, "transport", "pd", "pd or tcp")
		c.Flags().StringVar(&cfg.Socket, "socket", pipedevice.DefaultSocket, "pd daemon socket")
		c.Flags().IntVar(&cfg.Size, "size", 65536, "message size in bytes")
		c.Flags().IntVar(&cfg.Conns, "conns", 1, "connections (the server waits for this many)")
		c.Flags().BoolVar(&cfg.Latency, "latency", false, "ping-pong latency instead of a stream (server echoes)")
		c.Flags().IntVar(&cfg.Ring, "ring", 0, "pd receive ring bytes per socket (0: the daemon's default)")
		c.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	}
	cmd.AddCommand(server, client)
	return cmd
}
