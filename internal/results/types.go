// Package results defines the one JSON document every peregrine run writes, and the arithmetic
// on it that every consumer must agree on: summaries (median/min/max over repetitions), ratios
// between configurations, and consistency checks.
//
// One file holds one run: a scenario (workload + parameters) measured on one or more
// configurations (style/mode), at one or more points (a size, a flow count, ...), several
// repetitions each. docs/results-schema.md documents every field.
package results

import (
	"encoding/json"
	"time"
)

// Schema names the format this package writes. Bump the number on any change an old reader would
// misread (renamed or re-meant fields); adding an optional field does not need a bump.
// v2 added cost accounting: Rep.Programs, Rep.NetRxNs, Rep.SenderCPUNs and the derived cost_*
// and bpf_* metrics (cost.go). v1 files are still read: Decode upgrades them (see Upgrade).
const Schema = "peregrine.run/v2"

// Run is one benchmark run: everything needed to redraw its figures without the machine.
type Run struct {
	Schema   string    `json:"schema"`
	ID       string    `json:"id"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	// Complete is true only when every planned point and repetition ran. A run that was
	// interrupted is still written (with what it has) so that nothing measured is lost.
	Complete bool   `json:"complete"`
	Error    string `json:"error,omitempty"`

	Env      Env      `json:"env"`
	Lab      Lab      `json:"lab"`
	Scenario Scenario `json:"scenario"`
	// Arrangement is where the sender, the emulated IRQ and the stages run, for configs that do
	// not state their own (Config.Arrangement).
	Arrangement Arrangement `json:"arrangement"`
	Configs     []Config    `json:"configs"`
	Points      []Point     `json:"points"`
	Ratios      []Ratio     `json:"ratios,omitempty"`
	Notes       []string    `json:"notes,omitempty"`
}

// Env is the machine the run was measured on.
type Env struct {
	Kernel           string `json:"kernel"` // uname -r
	CPUs             int    `json:"cpus"`   // online CPUs
	CPUModel         string `json:"cpu_model,omitempty"`
	Hostname         string `json:"hostname,omitempty"`
	GoVersion        string `json:"go_version,omitempty"`
	PeregrineVersion string `json:"peregrine_version,omitempty"`
	// Virtualized names the hypervisor when known ("kvm"); steal time then matters.
	Virtualized string `json:"virtualized,omitempty"`
}

// Lab is the topology the run used (see internal/lab.Spec).
type Lab struct {
	Name string `json:"name,omitempty"`
	// Styles lists every style the configs use (docker, flannel, native): one run may compare
	// a native baseline with an overlay.
	Styles     []string `json:"styles"`
	Hosts      int      `json:"hosts"`
	Containers int      `json:"containers"` // per host
	MTU        int      `json:"mtu"`        // underlay MTU
	Underlay   string   `json:"underlay"`   // direct or switch
	// RxCPUs are the CPUs the underlay's receive is pinned to (the emulated IRQ cores); empty
	// means receive runs wherever the sender's xmit runs.
	RxCPUs []int `json:"rx_cpus,omitempty"`
	// NAPIThread: the underlay's NAPI ran in a kernel thread pinned to RxCPUs (the NIC stage on
	// the IRQ core); false: a veth polls its peer on the sending CPU.
	NAPIThread bool `json:"napi_thread,omitempty"`
}

// Arrangement says which CPUs did what. On a small machine it decides the result, so every run
// states it (DESIGN.md, "Measuring").
type Arrangement struct {
	SenderCPUs []int `json:"sender_cpus,omitempty"`
	IRQCPUs    []int `json:"irq_cpus,omitempty"`
	// StageCPUs are the CPUs the later receive stages (VXLAN, veth backlog) were allowed on.
	StageCPUs []int  `json:"stage_cpus,omitempty"`
	AppCPUs   []int  `json:"app_cpus,omitempty"` // receiving application
	Note      string `json:"note,omitempty"`
}

// IsZero reports whether nothing was stated.
func (a Arrangement) IsZero() bool {
	return len(a.SenderCPUs) == 0 && len(a.IRQCPUs) == 0 && len(a.StageCPUs) == 0 &&
		len(a.AppCPUs) == 0 && a.Note == ""
}

// Config is one configuration measured in the run.
type Config struct {
	Name  string `json:"name"`  // "<style>/<mode>", e.g. docker/vanilla, docker/falcon, native/host
	Style string `json:"style"` // docker, flannel, native
	Mode  string `json:"mode"`  // vanilla, rps, falcon, mflow, prism, ...
	// Knobs are the mode's settings that matter for reading the result (rps masks, batch size,
	// load threshold), as strings so any mode can record anything.
	Knobs map[string]string `json:"knobs,omitempty"`
	// Offloads is the offload state while this config ran, keyed "node/device" then by ethtool
	// feature name (rx-gro-hw, generic-receive-offload, ...) -> on. Per config because a mode
	// may change it.
	Offloads map[string]map[string]bool `json:"offloads,omitempty"`
	// Arrangement overrides Run.Arrangement for this config when set.
	Arrangement *Arrangement `json:"arrangement,omitempty"`
	// Placement is the config's CPU placement class (placement.go); empty in files written
	// before it was recorded.
	Placement Placement `json:"placement,omitempty"`
}

// Workloads a scenario can drive.
const (
	WorkloadIperf3TCP         = "iperf3-tcp"
	WorkloadIperf3UDP         = "iperf3-udp"
	WorkloadInjectUDP         = "inject-udp"
	WorkloadSockperfPingPong  = "sockperf-pingpong"
	WorkloadSockperfUnderLoad = "sockperf-underload"
	WorkloadMemcached         = "memcached"
	WorkloadNginx             = "nginx"
)

// Scenario is what was measured.
type Scenario struct {
	Name     string         `json:"name"`
	Workload string         `json:"workload"`
	Params   map[string]any `json:"params,omitempty"` // workload parameters (duration_s, sizes, ...)
	// Repetitions counts measured repetitions per point; Warmup counts extra, discarded ones.
	Repetitions int `json:"repetitions"`
	Warmup      int `json:"warmup"`
	// Interleaved is true when repetition i of every config ran back to back (A/B/A/B), so that
	// rep i of two configs saw the same machine conditions and can be paired.
	Interleaved bool `json:"interleaved"`
	// Primary is the headline metric (e.g. throughput_bps); Baseline is the config every other
	// config is compared with (e.g. docker/vanilla).
	Primary  string `json:"primary,omitempty"`
	Baseline string `json:"baseline,omitempty"`
}

// Point is one configuration at one position of the sweep.
type Point struct {
	Config string `json:"config"`
	// X is the position in the sweep, e.g. {"size": 64, "flows": 1}. Keys are lower-case names;
	// units are bytes for size, count for flows.
	X       map[string]float64 `json:"x"`
	Reps    []Rep              `json:"reps"`
	Summary map[string]Stat    `json:"summary,omitempty"` // filled by Summarize
}

// Rep is one repetition at one point.
type Rep struct {
	Index    int           `json:"index"` // 0-based; warm-ups share the numbering
	Warmup   bool          `json:"warmup,omitempty"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	// Metrics are the results, named with a unit suffix (see metrics.go): throughput_bps,
	// delivered_pps, latency_p99_us, ...
	Metrics map[string]float64 `json:"metrics"`
	Error   string             `json:"error,omitempty"` // a failed rep is kept but not summarized
	// CPU is the receiver's CPU time split per CPU over the measured interval.
	CPU []CPUShare `json:"cpu,omitempty"`
	// Softirqs are /proc/softirqs deltas: name (NET_RX, NET_TX, ...) -> count per CPU, indexed by CPU.
	Softirqs map[string][]uint64 `json:"softirqs,omitempty"`
	// Interrupts are /proc/interrupts deltas by kind (IRQKinds: device, cal, res, tlb, loc,
	// other) -> count per CPU, indexed like Softirqs. irqs_count is their sum.
	Interrupts map[string][]uint64 `json:"interrupts,omitempty"`
	// Stages attribute receive-path work to CPUs, one entry per (stage, device, CPU).
	Stages []StageCPU `json:"stages,omitempty"`
	// Counters are other deltas: nstat (TcpExtTCPOFOQueue, UdpRcvbufErrors, ...) and softnet
	// (softnet_dropped, softnet_time_squeeze, softnet_received_rps), by their source's name.
	Counters map[string]float64 `json:"counters,omitempty"`
	// Raw is the tool's own output (iperf3 -J, ...) for anything not extracted above.
	Raw json.RawMessage `json:"raw,omitempty"`

	// NetRxNs is the NET_RX softirq time per CPU (indexed by CPU) from the stage probe: all the
	// kernel's receive work, attributed to a stage or not.
	NetRxNs []uint64 `json:"net_rx_ns,omitempty"`
	// SenderCPUNs is the CPU time of the sending thread (injector) over the interval, from its
	// own rusage; 0 when the sender is an external tool.
	SenderCPUNs uint64 `json:"sender_cpu_ns,omitempty"`
	// Programs are the eBPF programs peregrine loaded, with what they did in the interval
	// (kernel BPF run-time statistics).
	Programs []ProgramRuns `json:"programs,omitempty"`
}

// Program roles in Rep.Programs.
const (
	RoleDatapath    = "datapath"    // a mode's program on the measured path
	RoleProbe       = "probe"       // the stage probe (measurement overhead)
	RoleSender      = "sender"      // the injector's program
	RoleCalibration = "calibration" // the empty program whose cost is netted out of the others
)

// ProgramRuns is one eBPF program's work over a repetition.
type ProgramRuns struct {
	Name  string `json:"name"` // kernel name, e.g. prg_falcon_nic
	ID    uint32 `json:"id"`
	Type  string `json:"type,omitempty"`
	Role  string `json:"role"`
	Runs  uint64 `json:"runs"`
	RunNs uint64 `json:"run_ns"` // total run time in the interval, statistics overhead included
}

// CPUShare is one CPU's time split as fractions of the interval (0..1, summing to 1). Nice is
// counted as user, iowait as idle; guest time is already inside user in /proc/stat.
type CPUShare struct {
	CPU     int     `json:"cpu"`
	User    float64 `json:"user"`
	System  float64 `json:"system"`
	IRQ     float64 `json:"irq"`
	Softirq float64 `json:"softirq"`
	Idle    float64 `json:"idle"`
	Steal   float64 `json:"steal,omitempty"` // hypervisor took the CPU (VMs)
}

// Busy is the non-idle, non-steal share.
func (c CPUShare) Busy() float64 { return c.User + c.System + c.IRQ + c.Softirq }

// Sum is the total of all shares; 1 for a consistent sample.
func (c CPUShare) Sum() float64 { return c.Busy() + c.Idle + c.Steal }

// StageCPU is the work one receive stage did on one CPU (from the tracepoint probes).
type StageCPU struct {
	Stage     string `json:"stage"` // nic, vxlan, bridge, veth-host, veth (see lab.Device.Stage)
	Netns     string `json:"netns,omitempty"`
	Device    string `json:"device,omitempty"`
	CPU       int    `json:"cpu"`
	Packets   uint64 `json:"packets"`
	SoftirqNs uint64 `json:"softirq_ns,omitempty"` // NET_RX softirq time spent for this stage
}

// Stat summarizes one metric over the measured repetitions of a point.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Spread kinds of a Ratio.
const (
	// SpreadPairs: Min/Max are the extremes of per-repetition ratios num[i]/den[i] of
	// interleaved repetitions.
	SpreadPairs = "pairs"
	// SpreadBounds: repetitions were not paired; Min = num.Min/den.Max and Max = num.Max/den.Min,
	// the widest the ratio could be.
	SpreadBounds = "bounds"
)

// Ratio compares one config with another at one point: Median is median(num)/median(den).
type Ratio struct {
	Metric      string             `json:"metric"`
	Numerator   string             `json:"numerator"`   // config name
	Denominator string             `json:"denominator"` // config name
	X           map[string]float64 `json:"x"`
	Median      float64            `json:"median"`
	Min         float64            `json:"min"`
	Max         float64            `json:"max"`
	Spread      string             `json:"spread"` // pairs or bounds
	N           int                `json:"n"`      // pairs (pairs) or min(n_num, n_den) (bounds)
}
