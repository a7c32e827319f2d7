// Package inject emulates a remote VXLAN sender cheaply: it builds pre-encapsulated VXLAN frames
// once and pushes them out of the sending host's underlay device with AF_PACKET + sendmmsg.
//
// On a one-machine lab a real sender (iperf3, sockperf) burns the receiver's cores on socket and
// encapsulation work; injecting finished frames costs one syscall per batch of frames and a
// 16-byte write per frame, so the CPU budget goes to the receive path being measured. The
// package keeps no global state: Run can be called concurrently with different configs and from
// a separate process.
//
// In plain mode (Config.Plain) it sends the same datagrams without the overlay (Ethernet | IPv4 |
// UDP | payload between the hosts' underlay addresses), so the same sender emulation drives the
// native baseline.
package inject

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Well-known VXLAN destination ports.
const (
	PortIANA    = 4789 // docker overlay, the RFC 7348 port
	PortFlannel = 8472 // the Linux kernel's historical default, used by flannel.1
)

// Kernel default for VXLAN source ports when no range is configured (net.ipv4.ip_local_port_range);
// the upper bound is exclusive, as in udp_flow_src_port.
const (
	DefaultSrcPortMin = 32768
	DefaultSrcPortMax = 61000
)

// DefaultBatch is the number of frames handed to one sendmmsg call.
const DefaultBatch = 64

// Config describes the frames to inject and how fast. Zero values take the defaults noted.
type Config struct {
	// Netns is the sending "host" namespace (empty: the caller's). Device is its underlay link.
	Netns  string `json:"netns,omitempty"`
	Device string `json:"device"`

	// Plain sends bare UDP datagrams instead of VXLAN frames, for the native (no overlay)
	// baseline: Ethernet SrcMAC/DstMAC, IPv4 SrcIP/DstIP, UDP ports InnerSrcPort+flow and
	// InnerDstPort, and the same payload as in VXLAN mode. DstPort, the source port range, VNI and
	// the other Inner* fields are then ignored and need not be set.
	Plain bool `json:"plain,omitempty"`

	// Outer (plain mode: the only) Ethernet. SrcMAC defaults to Device's own address. DstMAC is the receiving host's
	// underlay MAC and must be given (we send raw frames: nobody resolves it for us).
	SrcMAC MAC `json:"src_mac,omitempty"`
	DstMAC MAC `json:"dst_mac"`

	// Outer (plain mode: the only) IPv4, and outer UDP. DstPort defaults to 4789. Source ports: SrcPortMin == SrcPortMax != 0
	// pins one port (all flows share one outer 4-tuple, like a tunnel with a fixed source port);
	// otherwise each inner flow is hashed into [SrcPortMin, SrcPortMax) the way the kernel's vxlan
	// does, default [32768, 61000).
	SrcIP      netip.Addr `json:"src_ip"`
	DstIP      netip.Addr `json:"dst_ip"`
	DstPort    uint16     `json:"dst_port,omitempty"`
	SrcPortMin uint16     `json:"src_port_min,omitempty"`
	SrcPortMax uint16     `json:"src_port_max,omitempty"`
	VNI        uint32     `json:"vni"`

	// Inner frame. InnerDstMAC is what the receiving VXLAN device accepts: its own MAC when the
	// overlay address sits on the VXLAN device (flannel.1), or the container's MAC behind a bridge
	// (docker). InnerSrcMAC defaults to a locally administered address derived from InnerSrcIP.
	InnerSrcMAC  MAC        `json:"inner_src_mac,omitempty"`
	InnerDstMAC  MAC        `json:"inner_dst_mac"`
	InnerSrcIP   netip.Addr `json:"inner_src_ip"`
	InnerDstIP   netip.Addr `json:"inner_dst_ip"`
	InnerSrcPort uint16     `json:"inner_src_port,omitempty"` // default 10000; flow i uses InnerSrcPort+i (also in plain mode)
	InnerDstPort uint16     `json:"inner_dst_port"`           // the sink's port (also in plain mode)

	PayloadSize int `json:"payload_size,omitempty"` // UDP payload bytes (inner in VXLAN mode), PayloadMin..PayloadMax, default PayloadMin
	Flows       int `json:"flows,omitempty"`        // distinct flows (UDP source ports), default 1

	// Rate in frames per second; 0 sends as fast as the kernel takes them.
	Rate float64 `json:"rate,omitempty"`
	// Stop after Duration or after Count frames sent, whichever comes first (at least one is required).
	Duration time.Duration `json:"duration,omitempty"`
	Count    uint64        `json:"count,omitempty"`

	// Method is how frames are sent: MethodXDP (default; live-frame BPF_PROG_RUN) or
	// MethodPacket (AF_PACKET sendmmsg, for devices whose peer cannot take XDP frames).
	Method string `json:"method,omitempty"`

	// CPU pins the sending thread (the "remote sender's" core); nil leaves it to the scheduler.
	CPU *int `json:"cpu,omitempty"`
	// Batch is the number of frames per sendmmsg (default DefaultBatch, at most 1024) or per
	// BPF_PROG_RUN (XDP: default 8192 unpaced, else what fell due at Rate; at most 65536).
	Batch int `json:"batch,omitempty"`
	// QdiscBypass sends straight to the driver (PACKET_QDISC_BYPASS), skipping the device's qdisc:
	// cheaper, but a stopped queue then drops instead of queueing.
	QdiscBypass bool `json:"qdisc_bypass,omitempty"`
	// StallTimeout is the watchdog: Run fails if no frame is accepted for this long. Default 2 s.
	StallTimeout time.Duration `json:"stall_timeout,omitempty"`
}

// WithDefaults returns a copy with zero fields filled in and checks what cannot be defaulted
// (a CLI can call it to reject a config early). It does not touch the device: a zero SrcMAC is
// filled in by Run once the device is known.
func (c Config) WithDefaults() (Config, error) {
	if !c.Plain {
		c.DstPort = cmp.Or(c.DstPort, PortIANA)
		if c.SrcPortMin == 0 && c.SrcPortMax == 0 {
			c.SrcPortMin, c.SrcPortMax = DefaultSrcPortMin, DefaultSrcPortMax
		}
		if c.InnerSrcMAC.IsZero() && c.InnerSrcIP.Is4() {
			ip := c.InnerSrcIP.As4()
			c.InnerSrcMAC = MAC{0x02, 0x42, ip[0], ip[1], ip[2], ip[3]} // docker's scheme
		}
	}
	c.InnerSrcPort = cmp.Or(c.InnerSrcPort, 10000)
	c.PayloadSize = cmp.Or(c.PayloadSize, PayloadMin)
	c.Flows = cmp.Or(c.Flows, 1)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.Method = cmp.Or(c.Method, MethodXDP)
	c.StallTimeout = cmp.Or(c.StallTimeout, 2*time.Second)

	var errs []error
	if c.Device == "" {
		errs = append(errs, errors.New("device is required"))
	}
	if c.DstMAC.IsZero() {
		errs = append(errs, errors.New("dst_mac (the receiving host's underlay MAC) is required"))
	}
	type addr struct {
		name string
		ip   netip.Addr
	}
	addrs := []addr{{"src_ip", c.SrcIP}, {"dst_ip", c.DstIP}}
	if !c.Plain {
		addrs = append(addrs, addr{"inner_src_ip", c.InnerSrcIP}, addr{"inner_dst_ip", c.InnerDstIP})
		if c.InnerDstMAC.IsZero() {
			errs = append(errs, errors.New("inner_dst_mac (the receiving VXLAN device's or container's MAC) is required"))
		}
		if c.VNI >= 1<<24 {
			errs = append(errs, fmt.Errorf("vni %d does not fit in 24 bits", c.VNI))
		}
		if c.SrcPortMin > c.SrcPortMax {
			errs = append(errs, fmt.Errorf("src_port_min %d > src_port_max %d", c.SrcPortMin, c.SrcPortMax))
		}
	}
	for _, a := range addrs {
		if !a.ip.Is4() {
			errs = append(errs, fmt.Errorf("%s must be an IPv4 address, got %q", a.name, a.ip))
		}
	}
	if c.InnerDstPort == 0 {
		errs = append(errs, errors.New("inner_dst_port (the sink's UDP port) is required"))
	}
	if c.PayloadSize < PayloadMin || c.PayloadSize > PayloadMax {
		errs = append(errs, fmt.Errorf("payload_size %d outside %d..%d", c.PayloadSize, PayloadMin, PayloadMax))
	}
	if c.Flows < 1 || int(c.InnerSrcPort)+c.Flows-1 > 65535 {
		errs = append(errs, fmt.Errorf("flows %d from inner_src_port %d runs past port 65535", c.Flows, c.InnerSrcPort))
	}
	if c.Rate < 0 {
		errs = append(errs, fmt.Errorf("rate %v is negative", c.Rate))
	}
	if c.Duration <= 0 && c.Count == 0 {
		errs = append(errs, errors.New("give a duration or a count (or both)"))
	}
	switch c.Method {
	case MethodXDP:
		if c.Batch < 1 || c.Batch > xdpBatchMax {
			errs = append(errs, fmt.Errorf("batch %d outside 1..%d", c.Batch, xdpBatchMax))
		}
		if c.Flows > 1024 {
			errs = append(errs, fmt.Errorf("flows %d: the XDP injector counts at most 1024", c.Flows))
		}
	case MethodPacket:
		if c.Batch < 1 || c.Batch > 1024 {
			errs = append(errs, fmt.Errorf("batch %d outside 1..1024", c.Batch))
		}
	default:
		errs = append(errs, fmt.Errorf("method %q: use %s or %s", c.Method, MethodXDP, MethodPacket))
	}
	if c.CPU != nil && *c.CPU < 0 {
		errs = append(errs, fmt.Errorf("cpu %d is negative", *c.CPU))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("inject config: %w", err)
	}
	return c, nil
}
