package inject

import "time"

// Stats is what one Run did. Attempted == Sent + Refused: a refused frame is retried with the
// same sequence number, so the receiver's sequence accounting only sees real losses.
type Stats struct {
	Attempted uint64 `json:"attempted"` // frame transmissions offered to the kernel, retries included
	Sent      uint64 `json:"sent"`      // frames the kernel accepted (distinct sequence numbers)
	Refused   uint64 `json:"refused"`   // offers the kernel refused (ENOBUFS/EAGAIN/...): backpressure
	Unsent    uint64 `json:"unsent"`    // frames built for the last batch but not accepted before the end
	Backoffs  uint64 `json:"backoffs"`  // pauses taken because the kernel refused
	Syscalls  uint64 `json:"syscalls"`  // sendmmsg calls
	Bytes     uint64 `json:"bytes"`     // frame bytes accepted (outer frames in VXLAN mode)
	FrameLen  int    `json:"frame_len"` // bytes per frame on the wire (without FCS)
	Flows     int    `json:"flows"`
	// PPS is Sent over Duration (the time from the first send to the end).
	PPS      float64       `json:"pps"`
	Duration time.Duration `json:"duration_ns"`
	// MaxCall is the longest single sendmmsg; MaxGap the longest time between two calls
	// returning (sleeps and scheduling delays included): where an overrun comes from.
	MaxCall   time.Duration `json:"max_call_ns"`
	MaxGap    time.Duration `json:"max_gap_ns"`
	CPU       int           `json:"cpu"` // the sending thread's CPU pin, -1 if unpinned
	LastError string        `json:"last_error,omitempty"`

	Method string `json:"method"` // xdp or packet
	// SenderCPUNs is the sending thread's own CPU time (user + system, from its rusage) over the
	// run: what the emulated remote host spent. Softirq work that ran in the thread's context
	// (the veth peer's NAPI poll, scheduled on this CPU) is inside it.
	SenderCPUNs uint64 `json:"sender_cpu_ns"`
	// ProgRuns and ProgRunNs are prg_inject_xdp's run count and run time (XDP method, when the
	// kernel's BPF statistics are on).
	ProgRuns  uint64 `json:"prog_runs,omitempty"`
	ProgRunNs uint64 `json:"prog_run_ns,omitempty"`
	// XmitDropped are XDP frames the device's veth peer did not take (Sent minus the increase of
	// its ethtool tx_queue_N_xdp_xmit counters).
	XmitDropped uint64 `json:"xmit_dropped,omitempty"`
}
