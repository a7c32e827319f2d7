package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/pipedevice"
	"github.com/peregrine-net/peregrine/internal/pipedevice/pdbench"
	"github.com/peregrine-net/peregrine/internal/report"
	"github.com/peregrine-net/peregrine/internal/results"
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
  peregrine pd perf client --connect 127.0.0.1:5201 --size 65536 --time 5s

  # the whole comparison: kernel TCP, sockmap shortcut, pd engine and direct, two lab containers
  sudo peregrine pd bench

  # C programs: #include "pd.h", link -lpd (make build puts bin/libpd.so and bin/libpd.a there)
  cc -Ilibpd app.c -Lbin -lpd -o app && PD_SOCKET=/run/peregrine/pd/pd.sock ./app`,
	}
	cmd.AddCommand(newPdDaemonCmd(), newPdStatusCmd(), newPdPerfCmd(), newPdBenchCmd())
	return cmd
}

func newPdDaemonCmd() *cobra.Command {
	var socket, cpus, mode string
	var ring, pool int
	var spin time.Duration
	lim := pipedevice.DefaultLimits
	var bytesPerNS string
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

Containers reach the daemon through its unix socket, which lives in a directory of its own
(/run/peregrine/pd): bind-mount that directory read-only into the container, and nothing else of
/run/peregrine (e.g. docker run -v /run/peregrine/pd:/run/peregrine/pd:ro). A --socket elsewhere
needs an existing directory that others cannot write; only a stale socket there is replaced.

Every client is untrusted. Callers are told apart by their network namespace (taken once, from
the connecting process), may bind only its addresses, and reach listeners only in their own
namespace or their tenant domain (namespaces whose veths hang on the same bridge); an address two
namespaces of the domain share is refused. Limits per client and per namespace (below) are
refused with EMFILE (sockets), ENOBUFS (memory, queue depth) or EAGAIN (control connections);
their defaults fit a 4096-connection workload with rings up to 256 KiB. A client that faults the
engine or stops reading its replies is dropped, counted and logged; "pd status" shows the counts.`,
		Example: `  sudo peregrine pd daemon
  sudo peregrine pd daemon --engine-cpus 1 --mode direct
  sudo mkdir -m 0755 /run/pd-a && sudo peregrine pd daemon --socket /run/pd-a/pd.sock --ring 65536   # small rings for many connections`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := parseBytes(bytesPerNS)
			if err != nil {
				return fmt.Errorf("--max-bytes-per-ns: %w", err)
			}
			lim.BytesPerNS = b
			cfg := pipedevice.Config{Socket: socket, Ring: ring, Pool: pool, Spin: spin, Limits: lim}
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
	f := cmd.Flags()
	f.IntVar(&lim.ClientsPerNS, "max-clients-per-ns", lim.ClientsPerNS, "control connections (processes) per network namespace")
	f.IntVar(&lim.SocksPerClient, "max-sockets-per-client", lim.SocksPerClient, "sockets per process (its socket table)")
	f.IntVar(&lim.SocksPerNS, "max-sockets-per-ns", lim.SocksPerNS, "sockets per network namespace (a connection's two ends count for the connecting one)")
	f.IntVar(&lim.PendingPerProc, "max-pending-per-client", lim.PendingPerProc, "unaccepted connections waiting on one process's listeners")
	f.IntVar(&lim.MaxQDepth, "max-queue-depth", lim.MaxQDepth, "deepest submission/completion queue a process may ask for (power of two)")
	f.StringVar(&bytesPerNS, "max-bytes-per-ns", "4GiB", "shared memory (rings, pools, queues) per network namespace")
	f.IntVar(&lim.HugePerNS, "max-hugepages-per-ns", lim.HugePerNS, "2 MiB hugepages per network namespace (beyond: normal pages)")
	return cmd
}

func newPdStatusCmd() *cobra.Command {
	var socket string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show what the PipeDevice daemon holds",
		Long: `Asks a running daemon (over its socket) what it holds: mode, engine CPUs, how many rings
are live and whether they got hugepages (reserve some with sysctl vm.nr_hugepages=N, else rings
use normal pages), bytes copied by the engine or published in place (direct mode), queue
entries handled and refused, clients dropped and requests refused by limits, the limits, what
each network namespace holds, and each client process with its namespace and sockets. Root sees
everything; any other caller becomes a client first and sees its own namespace only.`,
		Example: `  peregrine pd status
  peregrine pd status --socket /run/pd-a/pd.sock --json | jq .clients`,
		Args: cobra.NoArgs,
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
			fmt.Fprintf(w, "socket      %s\nmode        %s\nengine CPUs %v\nrings       %d live; made so far: %d on hugepages, %d on normal pages\nhugepages   %s\n",
				st.Socket, st.Mode, st.Engines, st.RingsLive, st.RingsHuge, st.RingsNormal, st.Hugepages)
			fmt.Fprintf(w, "moved       %d B copied, %d B published in place, %d entries (%d failed: refused by the engine)\n", st.BytesCopied, st.BytesPublish, st.Entries, st.FailedEntries)
			if st.InternalErrs > 0 {
				fmt.Fprintf(w, "internal    %d requests hit a daemon bug (their clients were dropped; see the daemon's stderr)\n", st.InternalErrs)
			}
			fmt.Fprintf(w, "dropped     %d clients (faulted the engine or stopped reading replies); %d requests refused by limits\n", st.Dropped, st.Refused)
			l := st.Limits
			fmt.Fprintf(w, "limits      per namespace: %d clients, %d sockets, %d B shared memory, %d hugepages; per client: %d sockets, %d pending, queue depth <= %d\n",
				l.ClientsPerNS, l.SocksPerNS, l.BytesPerNS, l.HugePerNS, l.SocksPerClient, l.PendingPerProc, l.MaxQDepth)
			if st.Note != "" {
				fmt.Fprintf(w, "note        %s\n", st.Note)
			}
			fmt.Fprintf(w, "%-22s %8s %8s %14s %9s\n", "NETNS", "CLIENTS", "SOCKETS", "SHARED BYTES", "HUGEPAGES")
			for ns, u := range st.Usage {
				fmt.Fprintf(w, "%-22s %8d %8d %14d %9d\n", ns, u.Conns, u.Socks, u.Bytes, u.Huge)
			}
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
ping-pong of --size bytes, round-trip percentiles) between a server and a client, like iperf.
--transport pd goes through the PipeDevice daemon; --transport tcp through kernel TCP (the
baseline, and the sockmap shortcut when "pd bench" puts both ends in its cgroup). The server
serves one client run (it waits for --conns connections) and exits; both ends print their own
figures: bytes, Gbit/s, and the CPU seconds of their process (user + system), as a line or as
JSON (--json). By default the sender writes every message and the receiver reads every byte, so
a zero-copy path is not credited with data nobody touched (--no-touch turns that off).`,
		Example: `  peregrine pd perf server --bind 127.0.0.1:5201 &
  peregrine pd perf client --connect 127.0.0.1:5201 --size 65536 --time 5s --json

  # PipeDevice between two lab containers (the daemon runs on the host; the socket is reachable
  # from the containers since lab namespaces share the file system)
  sudo peregrine pd daemon --socket /run/pd-a/pd.sock &
  sudo peregrine lab exec h1-c2 -- peregrine pd perf server --socket /run/pd-a/pd.sock --bind 198.19.1.3:5201 &
  sudo peregrine lab exec h1-c1 -- peregrine pd perf client --socket /run/pd-a/pd.sock --connect 198.19.1.3:5201 --conns 8

  # latency at 64 B, kernel TCP between two lab containers
  sudo peregrine lab exec h1-c2 -- peregrine pd perf server --transport tcp --bind 0.0.0.0:5201 --latency &
  sudo peregrine lab exec h1-c1 -- peregrine pd perf client --transport tcp --connect 198.19.1.3:5201 --latency --size 64`,
	}
	server := &cobra.Command{Use: "server", Short: "Serve one perf run (sink, or echo with --latency)", Args: cobra.NoArgs, RunE: run("server"),
		Example: `  peregrine pd perf server --bind 127.0.0.1:5201
  peregrine pd perf server --transport tcp --bind 0.0.0.0:5201 --conns 16 --json
  peregrine pd perf server --bind 127.0.0.1:5201 --latency --size 64`}
	client := &cobra.Command{Use: "client", Short: "Run the measuring end (stream, or ping-pong with --latency)", Args: cobra.NoArgs, RunE: run("client"),
		Example: `  peregrine pd perf client --connect 127.0.0.1:5201 --size 65536 --time 5s
  peregrine pd perf client --transport tcp --connect 127.0.0.1:5201 --conns 16 --json
  peregrine pd perf client --connect 127.0.0.1:5201 --latency --size 64 --count 10000`}
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
		c.Flags().IntVar(&cfg.Spin, "spin", -1, "pd: looks at the rings (yielding between) before sleeping on the eventfd; -1: 50 with --latency, else 0")
		c.Flags().BoolVar(&cfg.NoTouch, "no-touch", false, "do not write each message before sending nor read what arrives (by default both ends touch the data, as applications do)")
		c.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	}
	cmd.AddCommand(server, client)
	return cmd
}

func newPdBenchCmd() *cobra.Command {
	var o pdbench.PDOptions
	var transports string
	var sizes, latSizes, scale []int
	var asJSON bool
	var out, reportDir string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Compare kernel TCP, the sockmap shortcut and PipeDevice (engine, direct) between two lab containers",
		Long: `Builds a docker-style lab (two hosts of two containers, named --name, removed at the end) and
runs "pd perf" between the two containers of host h1 over each transport, side by side in one
run:

  tcp        kernel TCP over the bridge and two veths (the paper's baseline)
  sockmap    the same TCP sockets with a sockops + sk_msg program redirecting sends socket to
             socket (bpf_msg_redirect_hash, as Cilium does)
  pd-engine  PipeDevice, the daemon's engine thread copying between rings
  pd-direct  PipeDevice, senders writing into the peer's ring, nothing copied

Measured: throughput and CPU per GiB for each message size (app = client + server processes,
application and library; total = the whole machine's busy time, so kernel softirqs and the
daemon's engine count), ping-pong round trips (p50/p99), aggregate throughput at many
connections, and fairness (stddev/mean of --pairs client processes). The table ends with the
issue's targets as ratios against tcp. Needs root; run one benchmark at a time.`,
		Example: `  sudo peregrine pd bench
  sudo peregrine pd bench --engine-cpus 1 --time 5s --json > pd.json
  sudo peregrine pd bench --transports tcp,pd-engine --sizes 65536 --scale 128,4096
  sudo peregrine pd bench --results results/pd       # result files + HTML report with plots`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Transports = strings.Split(transports, ",")
			o.Sizes, o.LatSizes, o.ScaleConns = sizes, latSizes, scale
			o.Log = func(f string, a ...any) { stderrLog(f, a...) }
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			started := time.Now()
			rep, err := pdbench.RunPD(ctx, o)
			if rep == nil {
				return err
			}
			if reportDir != "" {
				if werr := writePDResults(reportDir, pdbench.PDRuns(rep, o, started, time.Now(), Version)); werr != nil {
					return errors.Join(err, werr)
				}
			}
			if out != "" {
				b, _ := json.MarshalIndent(rep, "", "  ")
				if werr := os.WriteFile(out, b, 0o644); werr != nil {
					return werr
				}
			}
			if asJSON {
				if perr := printJSON(cmd.OutOrStdout(), rep); perr != nil {
					return perr
				}
			} else {
				printPDReport(cmd.OutOrStdout(), rep)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&o.Lab, "name", "pdb", "lab to build (and remove)")
	cmd.Flags().StringVar(&transports, "transports", "tcp,sockmap,pd-engine,pd-direct", "what to compare")
	cmd.Flags().IntSliceVar(&sizes, "sizes", []int{64, 1024, 8192, 65536, 1 << 20}, "message sizes of the throughput sweep")
	cmd.Flags().IntSliceVar(&latSizes, "latency-sizes", []int{64, 8192}, "ping-pong message sizes")
	cmd.Flags().IntVar(&o.LatCount, "count", 5000, "round trips per latency point")
	cmd.Flags().IntSliceVar(&scale, "scale", []int{128, 4096}, "connection counts of the aggregate-throughput points (1 KiB messages, 16 KiB rings)")
	cmd.Flags().IntVar(&o.Pairs, "pairs", 16, "client processes of the fairness point")
	cmd.Flags().DurationVar(&o.Duration, "time", 3*time.Second, "length of each throughput run")
	cmd.Flags().StringVar(&o.EngineCPUs, "engine-cpus", "", "the daemon's --engine-cpus (empty: one unpinned engine)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	cmd.Flags().StringVar(&out, "out", "", "also write the JSON report to this file")
	cmd.Flags().StringVar(&reportDir, "results", "", "also write result files of the bench schema (one per test: throughput, latency, scale, fairness; docs/results-schema.md) and the HTML report with plots into this directory, as `peregrine bench` does")
	return cmd
}

func printPDReport(w io.Writer, rep *pdbench.PDReport) {
	fmt.Fprintf(w, "kernel %s, %d CPUs\n\n", rep.Kernel, rep.CPUs)
	fmt.Fprintf(w, "%-10s %-10s %8s %6s %9s %12s %12s %12s %9s %9s %8s\n", "TEST", "TRANSPORT", "SIZE", "CONNS", "Gbit/s", "app CPU-s/GiB", "total CPU-s/GiB", "engine", "p50 us", "p99 us", "cv")
	for _, p := range rep.Points {
		if p.Err != "" {
			fmt.Fprintf(w, "%-10s %-10s %8d %6d  error: %s\n", p.Test, p.Transport, p.Size, p.Conns, p.Err)
			continue
		}
		fmt.Fprintf(w, "%-10s %-10s %8d %6d %9.2f %12.3f %12.3f %12.3f %9.1f %9.1f %8.3f\n", p.Test, p.Transport, p.Size, p.Conns,
			p.Gbps, p.AppCPU, p.TotalCPU, p.EngineCPU, p.P50us, p.P99us, p.FairCV)
	}
	find := func(test, tr string, size, conns int) *pdbench.PDPoint {
		for i := range rep.Points {
			p := &rep.Points[i]
			if p.Test == test && p.Transport == tr && p.Size == size && (conns == 0 || p.Conns == conns) && p.Err == "" {
				return p
			}
		}
		return nil
	}
	ratio := func(a, b float64) string {
		if b == 0 || math.IsNaN(a/b) {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	fmt.Fprintf(w, "\nissue 14 targets (ratios against tcp, this run)\n")
	for _, tr := range []string{"sockmap", "pd-engine", "pd-direct"} {
		t64, p64 := find("throughput", "tcp", 65536, 1), find("throughput", tr, 65536, 1)
		if t64 != nil && p64 != nil {
			fmt.Fprintf(w, "  %-10s 64 KiB: app CPU/GiB %s (target <= 0.35x), total CPU/GiB %s (<= 0.6x), throughput %s (>= 2x)\n", tr,
				ratio(p64.AppCPU, t64.AppCPU), ratio(p64.TotalCPU, t64.TotalCPU), ratio(p64.Gbps, t64.Gbps))
		}
		for _, sz := range []int{64, 8192} {
			tl, pl := find("latency", "tcp", sz, 0), find("latency", tr, sz, 0)
			if tl != nil && pl != nil {
				want := "0.7x"
				if sz == 8192 {
					want = "0.5x"
				}
				fmt.Fprintf(w, "  %-10s latency %d B: p50 %s, p99 %s (target <= %s)\n", tr, sz, ratio(pl.P50us, tl.P50us), ratio(pl.P99us, tl.P99us), want)
			}
		}
	}
	for _, tr := range []string{"tcp", "sockmap", "pd-engine", "pd-direct"} {
		var pts []*pdbench.PDPoint
		for i := range rep.Points {
			if p := &rep.Points[i]; p.Test == "scale" && p.Transport == tr && p.Err == "" {
				pts = append(pts, p)
			}
		}
		if len(pts) >= 2 {
			fmt.Fprintf(w, "  %-10s aggregate at %d vs %d connections: %s (target >= 0.9x)\n", tr, pts[len(pts)-1].Conns, pts[0].Conns, ratio(pts[len(pts)-1].Gbps, pts[0].Gbps))
		}
		if f := find("fairness", tr, 65536, 0); f != nil {
			fmt.Fprintf(w, "  %-10s fairness over %d pairs: stddev/mean %.3f (target < 0.10)\n", tr, f.Conns, f.FairCV)
		}
	}
}

// writePDResults writes pd bench's runs as result files and one HTML report over them.
func writePDResults(dir string, runs []*results.Run) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range runs {
		p := filepath.Join(dir, r.ID+".json")
		if err := r.Write(p); err != nil {
			return err
		}
		stderrLog("result: %s", p)
	}
	idx, err := report.HTML(filepath.Join(dir, "report-pd"), runs)
	if err != nil {
		return err
	}
	stderrLog("report: %s", idx)
	return nil
}

// parseBytes reads a byte count: a number with an optional KiB, MiB or GiB suffix.
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if v, ok := strings.CutSuffix(s, u.suf); ok {
			s, mult = v, u.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q: want a positive number of bytes, optionally with KiB, MiB or GiB", s)
	}
	return n * mult, nil
}
