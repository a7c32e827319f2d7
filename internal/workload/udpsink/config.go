// Package udpsink is a cheap UDP receiver for packet-rate experiments: it binds a port inside a
// namespace, drains it with recvmmsg, and accounts for every datagram the injector
// (internal/workload/inject) sent: per-flow sequence gaps (lost), duplicates, reordering with a
// coarse distance histogram, and the kernel's own view of receive drops.
//
// It keeps no global state; several sinks can run at once on different ports or namespaces.
package udpsink

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Defaults.
const (
	DefaultRcvBuf = 32 << 20 // big enough to ride out scheduling hiccups at ~1 Mpps of 64 B frames
	DefaultBatch  = 64
	bufSize       = 2048 // per datagram; longer ones are counted at full size but truncated
	pollInterval  = 50 * time.Millisecond
)

// Config describes where to listen and for how long.
type Config struct {
	Netns string     `json:"netns,omitempty"` // namespace of the receiving container (empty: ours)
	Addr  netip.Addr `json:"addr,omitempty"`  // bind address, default 0.0.0.0
	Port  uint16     `json:"port"`
	// Duration bounds the run (required). IdleTimeout, if set, ends it earlier once traffic has
	// started and then nothing arrived for that long.
	Duration    time.Duration `json:"duration"`
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	RcvBuf      int           `json:"rcvbuf,omitempty"` // bytes, default DefaultRcvBuf (forced past rmem_max)
	Batch       int           `json:"batch,omitempty"`  // datagrams per recvmmsg, default DefaultBatch
	CPU         *int          `json:"cpu,omitempty"`    // pin the receive thread; nil: unpinned
}

func (c Config) withDefaults() (Config, error) {
	if !c.Addr.IsValid() {
		c.Addr = netip.IPv4Unspecified()
	}
	c.RcvBuf = cmp.Or(c.RcvBuf, DefaultRcvBuf)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	var errs []error
	if !c.Addr.Is4() {
		errs = append(errs, fmt.Errorf("addr %s: only IPv4 is supported", c.Addr))
	}
	if c.Port == 0 {
		errs = append(errs, errors.New("port is required"))
	}
	if c.Duration <= 0 {
		errs = append(errs, errors.New("duration is required (the sink always runs bounded)"))
	}
	if c.Batch < 1 || c.Batch > 1024 {
		errs = append(errs, fmt.Errorf("batch %d outside 1..1024", c.Batch))
	}
	if c.CPU != nil && *c.CPU < 0 {
		errs = append(errs, fmt.Errorf("cpu %d is negative", *c.CPU))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("udpsink config: %w", err)
	}
	return c, nil
}
