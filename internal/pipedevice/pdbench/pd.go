package pdbench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/pdsockmap"
	"github.com/peregrine-net/peregrine/internal/pipedevice"
)

// PipeDevice comparison (issue 14): between two containers of one docker-style lab host, the
// same `peregrine pd perf` client and server over four transports, measured side by side in one
// run: kernel TCP over the bridge (the paper's baseline), TCP with the sockmap shortcut
// (Cilium-style), and PipeDevice in engine and direct modes.

// PDOptions drive RunPD.
type PDOptions struct {
	Exe        string   // the peregrine binary (default: this one)
	Lab        string   // lab name (default "pdb"); made and removed here
	Transports []string // tcp, sockmap, pd-engine, pd-direct
	Sizes      []int    // throughput sweep message sizes
	Duration   time.Duration
	LatSizes   []int
	LatCount   int
	ScaleConns []int // aggregate throughput points (pd transports and tcp)
	ScaleSize  int
	Pairs      int    // fairness: client processes, one connection each
	EngineCPUs string // the daemon's --engine-cpus
	Log        func(string, ...any)
}

// PDPoint is one measurement.
type PDPoint struct {
	Test      string  `json:"test"` // throughput, latency, scale, fairness
	Transport string  `json:"transport"`
	Size      int     `json:"size"`
	Conns     int     `json:"conns"`
	Gbps      float64 `json:"gbps,omitempty"`
	AppCPU    float64 `json:"app_cpu_s_per_gib,omitempty"`   // client + server (application + library)
	TotalCPU  float64 `json:"total_cpu_s_per_gib,omitempty"` // the whole machine: + kernel softirqs, + the daemon's engine
	EngineCPU float64 `json:"engine_cpu_s_per_gib,omitempty"`
	P50us     float64 `json:"rtt_p50_us,omitempty"`
	P99us     float64 `json:"rtt_p99_us,omitempty"`
	FairCV    float64 `json:"fairness_stddev_over_mean,omitempty"`
	Err       string  `json:"error,omitempty"`
}

// PDReport is what RunPD measured.
type PDReport struct {
	Kernel string    `json:"kernel"`
	CPUs   int       `json:"cpus"`
	Points []PDPoint `json:"points"`
}

func (o *PDOptions) defaults() {
	if o.Exe == "" {
		o.Exe, _ = os.Executable()
	}
	if o.Lab == "" {
		o.Lab = "pdb"
	}
	if len(o.Transports) == 0 {
		o.Transports = []string{"tcp", "sockmap", "pd-engine", "pd-direct"}
	}
	if len(o.Sizes) == 0 {
		o.Sizes = []int{64, 1024, 8192, 65536, 1 << 20}
	}
	if o.Duration == 0 {
		o.Duration = 3 * time.Second
	}
	if len(o.LatSizes) == 0 {
		o.LatSizes = []int{64, 8192}
	}
	if o.LatCount == 0 {
		o.LatCount = 5000
	}
	if len(o.ScaleConns) == 0 {
		o.ScaleConns = []int{128, 4096}
	}
	if o.ScaleSize == 0 {
		o.ScaleSize = 1024
	}
	if o.Pairs == 0 {
		o.Pairs = 16
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
}

type pdEnv struct {
	o          *PDOptions
	nsC, nsS   string // client and server containers
	ipS        string
	dir        string
	daemon     *exec.Cmd
	daemonMode string
	sock       string
	shortcut   *pdsockmap.Shortcut
	port       int
}

// RunPD builds a one-host docker-style lab with two containers, runs every measurement and
// removes everything it made.
func RunPD(ctx context.Context, o PDOptions) (*PDReport, error) {
	o.defaults()
	e := &pdEnv{o: &o, port: 6000}
	var err error
	if e.dir, err = os.MkdirTemp("", "prg-pdb-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(e.dir)
	os.Chmod(e.dir, 0o755)
	e.sock = filepath.Join(e.dir, "pd.sock")
	// A lab needs two hosts (an overlay has a remote end); both containers used are on h1.
	o.Log("lab up (docker style, 2 hosts x 2 containers; h1-c1 and h1-c2 are measured)")
	if out, err := exec.CommandContext(ctx, o.Exe, "lab", "up", "--style", "docker", "--hosts", "2", "--containers", "2", "--name", o.Lab).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lab up: %v: %s", err, out)
	}
	defer exec.Command(o.Exe, "lab", "down", "--name", o.Lab).Run()
	out, err := exec.CommandContext(ctx, o.Exe, "lab", "status", "--json", "--name", o.Lab).Output()
	if err != nil {
		return nil, fmt.Errorf("lab status: %v", err)
	}
	var l lab.Lab
	if err := json.Unmarshal(out, &l); err != nil {
		return nil, fmt.Errorf("lab status: %v", err)
	}
	var same []lab.Node
	for _, c := range l.Containers {
		if c.Host == l.Containers[0].Host {
			same = append(same, c)
		}
	}
	if len(same) < 2 {
		return nil, fmt.Errorf("lab %s: no two containers on one host", o.Lab)
	}
	e.nsC, e.nsS = same[0].Netns, same[1].Netns
	e.ipS = strings.Split(same[1].Addr, "/")[0]
	o.Log("client in %s, server in %s (%s)", same[0].Name, same[1].Name, e.ipS)
	rep := &PDReport{Kernel: l.Kernel, CPUs: l.CPUs}
	defer e.stopDaemon()
	defer func() {
		if e.shortcut != nil {
			e.shortcut.Close()
		}
	}()
	for _, tr := range o.Transports {
		if err := e.setup(tr); err != nil {
			return rep, err
		}
		for _, size := range o.Sizes {
			rep.Points = append(rep.Points, e.throughput(ctx, tr, size, 1, 0))
		}
		for _, size := range o.LatSizes {
			rep.Points = append(rep.Points, e.latency(ctx, tr, size))
		}
		for _, n := range o.ScaleConns {
			p := e.throughput(ctx, tr, o.ScaleSize, n, 16384)
			p.Test = "scale"
			rep.Points = append(rep.Points, p)
		}
		rep.Points = append(rep.Points, e.fairness(ctx, tr))
	}
	return rep, nil
}

func (e *pdEnv) setup(tr string) error {
	e.stopDaemon()
	switch tr {
	case "tcp":
		if e.shortcut != nil {
			e.shortcut.Close()
			e.shortcut = nil
		}
	case "sockmap":
		if e.shortcut == nil {
			s, err := pdsockmap.Attach(fmt.Sprintf("prg-pdb-%d", os.Getpid()))
			if err != nil {
				return err
			}
			e.shortcut = s
		}
	case "pd-engine", "pd-direct":
		mode := strings.TrimPrefix(tr, "pd-")
		args := []string{"pd", "daemon", "--socket", e.sock, "--mode", mode}
		if e.o.EngineCPUs != "" {
			args = append(args, "--engine-cpus", e.o.EngineCPUs)
		}
		e.daemon = exec.Command(e.o.Exe, args...)
		if err := e.daemon.Start(); err != nil {
			return err
		}
		for i := 0; i < 100; i++ {
			if _, err := pipedevice.DaemonStatus(e.sock); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	default:
		return fmt.Errorf("transport %q: want tcp, sockmap, pd-engine or pd-direct", tr)
	}
	return nil
}

func (e *pdEnv) stopDaemon() {
	if e.daemon != nil {
		e.daemon.Process.Signal(os.Interrupt)
		e.daemon.Wait()
		e.daemon = nil
	}
}

// perfArgs is the `pd perf` command line for a transport.
func (e *pdEnv) perfArgs(tr, role string, extra ...string) []string {
	t := "tcp"
	if strings.HasPrefix(tr, "pd") {
		t = "pd"
	}
	a := []string{"netns", "exec", e.nsS, e.o.Exe, "pd", "perf", role, "--transport", t, "--socket", e.sock, "--json"}
	if role == "client" {
		a[2] = e.nsC
		a = append(a, "--connect", fmt.Sprintf("%s:%d", e.ipS, e.port))
	} else {
		a = append(a, "--bind", fmt.Sprintf("%s:%d", e.ipS, e.port))
	}
	return append(a, extra...)
}

type perfProc struct {
	cmd *exec.Cmd
	out *strings.Builder
}

func (e *pdEnv) start(ctx context.Context, args []string) (*perfProc, error) {
	cmd := exec.CommandContext(ctx, "ip", args...)
	if e.shortcut != nil && e.daemon == nil {
		// sockmap: join the shortcut's cgroup before exec (ip netns exec hides /sys/fs/cgroup);
		// the membership survives the exec, so every socket the perf process makes is a candidate
		cmd = exec.CommandContext(ctx, "sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec ip "$@"`, e.shortcut.Cgroup}, args...)...)
	}
	var out strings.Builder
	cmd.Stdout = &out
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &perfProc{cmd: cmd, out: &out}
	if args[5] == "perf" && args[6] == "server" {
		// wait for "listening" on stderr
		r := bufio.NewReader(stderr)
		deadline := time.After(10 * time.Second)
		got := make(chan bool, 1)
		go func() {
			for {
				l, err := r.ReadString('\n')
				if strings.Contains(l, "listening") {
					got <- true
					io.Copy(io.Discard, r)
					return
				}
				if err != nil {
					got <- false
					return
				}
			}
		}()
		select {
		case ok := <-got:
			if !ok {
				cmd.Wait()
				return nil, fmt.Errorf("server did not start: %s", out.String())
			}
		case <-deadline:
			cmd.Process.Kill()
			cmd.Wait()
			return nil, fmt.Errorf("server did not start in 10 s")
		}
	} else {
		go io.Copy(io.Discard, stderr)
	}
	return p, nil
}

func (p *perfProc) result() (*pipedevice.PerfResult, error) {
	if err := p.cmd.Wait(); err != nil {
		return nil, fmt.Errorf("%v: %s", err, p.out.String())
	}
	var r pipedevice.PerfResult
	if err := json.Unmarshal([]byte(p.out.String()), &r); err != nil {
		return nil, fmt.Errorf("perf output %q: %v", p.out.String(), err)
	}
	return &r, nil
}

// machineBusy is the machine's busy CPU seconds so far (all CPUs, /proc/stat).
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	var busy float64
	for i, v := range f[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		busy += x
	}
	return busy / 100 // USER_HZ
}

func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

func (e *pdEnv) throughput(ctx context.Context, tr string, size, conns, ring int) PDPoint {
	pt := PDPoint{Test: "throughput", Transport: tr, Size: size, Conns: conns}
	e.port++
	extra := []string{"--size", strconv.Itoa(size), "--conns", strconv.Itoa(conns)}
	if ring > 0 {
		extra = append(extra, "--ring", strconv.Itoa(ring))
	}
	e.o.Log("%s: %d B messages, %d connection(s)", tr, size, conns)
	srv, err := e.start(ctx, e.perfArgs(tr, "server", extra...))
	if err != nil {
		pt.Err = err.Error()
		return pt
	}
	busy0, eng0 := machineBusy(), e.daemonCPU()
	cl, err := e.start(ctx, e.perfArgs(tr, "client", append(extra, "--time", e.o.Duration.String())...))
	if err != nil {
		srv.cmd.Process.Kill()
		pt.Err = err.Error()
		return pt
	}
	cr, cerr := cl.result()
	sr, serr := srv.result()
	busy, eng := machineBusy()-busy0, e.daemonCPU()-eng0
	if cerr != nil || serr != nil {
		pt.Err = fmt.Sprint(cerr, serr)
		return pt
	}
	pt.Gbps = sr.Gbps
	gib := float64(sr.Bytes) / (1 << 30)
	if gib > 0 {
		pt.AppCPU = (cr.CPUSeconds + sr.CPUSeconds) / gib
		pt.TotalCPU = busy / gib
		pt.EngineCPU = eng / gib
	}
	return pt
}

func (e *pdEnv) daemonCPU() float64 {
	if e.daemon == nil {
		return 0
	}
	return procCPU(e.daemon.Process.Pid)
}

func (e *pdEnv) latency(ctx context.Context, tr string, size int) PDPoint {
	pt := PDPoint{Test: "latency", Transport: tr, Size: size, Conns: 1}
	e.port++
	e.o.Log("%s: ping-pong %d B", tr, size)
	extra := []string{"--size", strconv.Itoa(size), "--latency"}
	srv, err := e.start(ctx, e.perfArgs(tr, "server", extra...))
	if err != nil {
		pt.Err = err.Error()
		return pt
	}
	cl, err := e.start(ctx, e.perfArgs(tr, "client", append(extra, "--count", strconv.Itoa(e.o.LatCount))...))
	if err != nil {
		srv.cmd.Process.Kill()
		pt.Err = err.Error()
		return pt
	}
	cr, cerr := cl.result()
	_, serr := srv.result()
	if cerr != nil || serr != nil {
		pt.Err = fmt.Sprint(cerr, serr)
		return pt
	}
	pt.P50us, pt.P99us = cr.RTTp50us, cr.RTTp99us
	return pt
}

// fairness: Pairs client processes, one connection each, to one server; the spread of the
// clients' throughput.
func (e *pdEnv) fairness(ctx context.Context, tr string) PDPoint {
	n := e.o.Pairs
	pt := PDPoint{Test: "fairness", Transport: tr, Size: 65536, Conns: n}
	e.port++
	e.o.Log("%s: %d pairs", tr, n)
	extra := []string{"--size", "65536"}
	srv, err := e.start(ctx, e.perfArgs(tr, "server", append(extra, "--conns", strconv.Itoa(n), "--ring", "262144")...))
	if err != nil {
		pt.Err = err.Error()
		return pt
	}
	var cls []*perfProc
	for i := 0; i < n; i++ {
		cl, err := e.start(ctx, e.perfArgs(tr, "client", append(extra, "--ring", "262144", "--time", e.o.Duration.String())...))
		if err != nil {
			pt.Err = err.Error()
			break
		}
		cls = append(cls, cl)
	}
	var g []float64
	for _, cl := range cls {
		r, err := cl.result()
		if err != nil {
			pt.Err = err.Error()
			continue
		}
		g = append(g, r.Gbps)
	}
	if pt.Err != "" {
		srv.cmd.Process.Kill()
	}
	srv.result()
	if len(g) == n {
		var sum, sq float64
		for _, x := range g {
			sum += x
		}
		mean := sum / float64(n)
		for _, x := range g {
			sq += (x - mean) * (x - mean)
		}
		pt.Gbps = sum
		if mean > 0 {
			pt.FairCV = math.Sqrt(sq/float64(n)) / mean
		}
	}
	return pt
}
