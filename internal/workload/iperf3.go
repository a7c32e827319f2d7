package workload

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Iperf3Config describes one iperf3 run: server in ServerNS listening on ServerAddr:Port,
// client in ClientNS sending to it for Duration.
type Iperf3Config struct {
	ServerNS   string `json:"server_ns"`
	ServerAddr string `json:"server_addr"`
	ClientNS   string `json:"client_ns"`
	Port       int    `json:"port"` // default 5201
	// Connect is the ip:port the client connects to when it is not the server's own: a
	// Service's ClusterIP:port that the normal path translates to ServerAddr:Port.
	Connect  string        `json:"connect,omitempty"`
	Duration time.Duration `json:"duration_ns"` // whole seconds (iperf3 -t takes integers); default 10 s
	UDP      bool          `json:"udp"`
	Streams  int           `json:"streams"` // -P; default 1
	// Length is iperf3's -l: the write size for TCP, the datagram payload for UDP.
	// 0 leaves iperf3's default (128 KB TCP, path-MTU-sized UDP). Range 16..65536 (UDP ..65507).
	Length int `json:"length"`
	// Bitrate is the target in bits/s per stream (-b); 0 means unlimited, which for UDP is
	// what a packet-rate stress wants (iperf3's own UDP default would be 1 Mbit/s).
	Bitrate    uint64 `json:"bitrate"`
	ServerCPUs string `json:"server_cpus,omitempty"` // taskset -c list, e.g. "0" or "0-1"
	ClientCPUs string `json:"client_cpus,omitempty"`
}

// Iperf3Result is what one run measured. For UDP the receiver-side (server) numbers are the
// truth: what the sender pushed into its socket says nothing about what arrived.
type Iperf3Result struct {
	Protocol         string         `json:"protocol"`
	Streams          int            `json:"streams"`
	Length           int            `json:"length"` // block size iperf3 used
	DurationS        float64        `json:"duration_s"`
	SentBytes        uint64         `json:"sent_bytes"`
	SentBps          float64        `json:"sent_bps"`
	ReceivedBytes    uint64         `json:"received_bytes"`
	ReceivedBps      float64        `json:"received_bps"`
	Retransmits      int64          `json:"retransmits"` // TCP only
	UDP              *Iperf3UDP     `json:"udp,omitempty"`
	PerStream        []Iperf3Stream `json:"per_stream"`
	CPU              Iperf3CPU      `json:"cpu"`
	SenderCongestion string         `json:"sender_congestion,omitempty"`
}

// Iperf3UDP holds the packet accounting of a UDP run, from the server's view except
// PacketsSent, which only the client knows.
type Iperf3UDP struct {
	PacketsSent      int64   `json:"packets_sent"`
	PacketsLost      int64   `json:"packets_lost"`
	PacketsDelivered int64   `json:"packets_delivered"` // server packets − server lost
	DeliveredPPS     float64 `json:"delivered_pps"`
	LostPercent      float64 `json:"lost_percent"`
	JitterMs         float64 `json:"jitter_ms"`
	OutOfOrder       int64   `json:"out_of_order"`
}

// Iperf3Stream is one parallel stream's share.
type Iperf3Stream struct {
	SentBytes        uint64  `json:"sent_bytes"`
	SentBps          float64 `json:"sent_bps"`
	ReceivedBytes    uint64  `json:"received_bytes"`
	ReceivedBps      float64 `json:"received_bps"`
	Retransmits      int64   `json:"retransmits,omitempty"`
	PacketsSent      int64   `json:"packets_sent,omitempty"`
	PacketsLost      int64   `json:"packets_lost,omitempty"`
	PacketsDelivered int64   `json:"packets_delivered,omitempty"`
	JitterMs         float64 `json:"jitter_ms,omitempty"`
}

// Iperf3CPU is iperf3's own CPU utilisation estimate in percent; local is the client.
type Iperf3CPU struct {
	LocalTotal   float64 `json:"local_total"`
	LocalUser    float64 `json:"local_user"`
	LocalSystem  float64 `json:"local_system"`
	RemoteTotal  float64 `json:"remote_total"`
	RemoteUser   float64 `json:"remote_user"`
	RemoteSystem float64 `json:"remote_system"`
}

func (c *Iperf3Config) defaults() error {
	c.Port = cmp.Or(c.Port, 5201)
	c.Duration = cmp.Or(c.Duration, 10*time.Second)
	c.Streams = cmp.Or(c.Streams, 1)
	if c.ServerAddr == "" {
		return errors.New("iperf3: server address is required")
	}
	if _, _, err := connectTo(c.Connect, c.ServerAddr, c.Port); err != nil {
		return fmt.Errorf("iperf3: %w", err)
	}
	maxLen := 65536
	if c.UDP {
		maxLen = 65507 // largest IPv4 UDP payload
	}
	if c.Length != 0 && (c.Length < 16 || c.Length > maxLen) {
		return fmt.Errorf("iperf3: length %d outside 16..%d", c.Length, maxLen)
	}
	if c.Streams < 1 || c.Streams > 128 {
		return fmt.Errorf("iperf3: streams %d outside 1..128", c.Streams)
	}
	return nil
}

// Run starts `iperf3 -s` in the server namespace, runs the client and parses its JSON.
func (c Iperf3Config) Run(ctx context.Context) (Iperf3Result, error) {
	if err := prepare(c.defaults, c.ServerNS, c.ClientNS); err != nil {
		return Iperf3Result{}, err
	}
	port := strconv.Itoa(c.Port)
	// -1: serve one test and exit; -J so --get-server-output returns the server's JSON.
	srv, err := startServer(ctx, c.ServerNS, "iperf3 server", c.ServerCPUs,
		[]string{"iperf3", "-s", "-1", "-J", "-B", c.ServerAddr, "-p", port}, "tcp", c.Port)
	if err != nil {
		return Iperf3Result{}, err
	}
	defer srv.stop()

	secs := secondsCeil(c.Duration)
	host, cport, _ := connectTo(c.Connect, c.ServerAddr, c.Port)
	argv := []string{"iperf3", "-c", host, "-p", cport, "-t", strconv.Itoa(secs), "-J",
		"-P", strconv.Itoa(c.Streams), "--connect-timeout", "3000", "--get-server-output"}
	if c.UDP {
		argv = append(argv, "-u", "-b", strconv.FormatUint(c.Bitrate, 10))
	} else if c.Bitrate > 0 {
		argv = append(argv, "-b", strconv.FormatUint(c.Bitrate, 10))
	}
	if c.Length > 0 {
		argv = append(argv, "-l", strconv.Itoa(c.Length))
	}
	stdout, stderr, err := runClient(ctx, c.ClientNS, "iperf3 client", c.ClientCPUs, argv, time.Duration(secs)*time.Second)
	if err != nil {
		return Iperf3Result{}, err // toolError already quotes iperf3's JSON "error"
	}
	res, err := ParseIperf3([]byte(stdout))
	if err != nil {
		return Iperf3Result{}, toolError("iperf3 client", c.ClientNS, err, stderr, stdout)
	}
	return res, nil
}

// iperf3 JSON, only the parts we use.
type iperf3Doc struct {
	Start struct {
		TestStart struct {
			Protocol   string `json:"protocol"`
			NumStreams int    `json:"num_streams"`
			Blksize    int    `json:"blksize"`
		} `json:"test_start"`
	} `json:"start"`
	End struct {
		Streams []struct {
			Sender   *iperf3Sum `json:"sender"`
			Receiver *iperf3Sum `json:"receiver"`
			UDP      *iperf3Sum `json:"udp"`
		} `json:"streams"`
		Sum         *iperf3Sum `json:"sum"`
		SumSent     *iperf3Sum `json:"sum_sent"`
		SumReceived *iperf3Sum `json:"sum_received"`
		CPU         struct {
			HostTotal    float64 `json:"host_total"`
			HostUser     float64 `json:"host_user"`
			HostSystem   float64 `json:"host_system"`
			RemoteTotal  float64 `json:"remote_total"`
			RemoteUser   float64 `json:"remote_user"`
			RemoteSystem float64 `json:"remote_system"`
		} `json:"cpu_utilization_percent"`
		SenderCongestion string `json:"sender_tcp_congestion"`
	} `json:"end"`
	Error        string     `json:"error"`
	ServerOutput *iperf3Doc `json:"server_output_json"`
}

type iperf3Sum struct {
	Seconds       float64 `json:"seconds"`
	Bytes         uint64  `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   int64   `json:"retransmits"`
	JitterMs      float64 `json:"jitter_ms"`
	LostPackets   int64   `json:"lost_packets"`
	Packets       int64   `json:"packets"`
	LostPercent   float64 `json:"lost_percent"`
	OutOfOrder    int64   `json:"out_of_order"`
}

// ParseIperf3 parses the client's `iperf3 -J` output (with --get-server-output for UDP
// receiver truth). iperf3 3.12 exits 0 on some failures, so the JSON "error" field is an error.
func ParseIperf3(b []byte) (Iperf3Result, error) {
	var d iperf3Doc
	if err := json.Unmarshal(b, &d); err != nil {
		return Iperf3Result{}, fmt.Errorf("parse iperf3 JSON: %w", err)
	}
	if d.Error != "" {
		return Iperf3Result{}, fmt.Errorf("iperf3 reported: %s", d.Error)
	}
	e := d.End
	if e.SumSent == nil || e.SumReceived == nil {
		return Iperf3Result{}, errors.New("iperf3 JSON has no end.sum_sent/sum_received (test did not complete)")
	}
	r := Iperf3Result{
		Protocol:         d.Start.TestStart.Protocol,
		Streams:          d.Start.TestStart.NumStreams,
		Length:           d.Start.TestStart.Blksize,
		DurationS:        e.SumSent.Seconds,
		SentBytes:        e.SumSent.Bytes,
		SentBps:          e.SumSent.BitsPerSecond,
		ReceivedBytes:    e.SumReceived.Bytes,
		ReceivedBps:      e.SumReceived.BitsPerSecond,
		Retransmits:      e.SumSent.Retransmits,
		SenderCongestion: e.SenderCongestion,
		CPU: Iperf3CPU{
			LocalTotal: e.CPU.HostTotal, LocalUser: e.CPU.HostUser, LocalSystem: e.CPU.HostSystem,
			RemoteTotal: e.CPU.RemoteTotal, RemoteUser: e.CPU.RemoteUser, RemoteSystem: e.CPU.RemoteSystem,
		},
	}
	if r.Protocol == "UDP" {
		parseIperf3UDP(&d, &r)
		return r, nil
	}
	for _, s := range e.Streams {
		var ps Iperf3Stream
		if s.Sender != nil {
			ps.SentBytes, ps.SentBps, ps.Retransmits = s.Sender.Bytes, s.Sender.BitsPerSecond, s.Sender.Retransmits
		}
		if s.Receiver != nil {
			ps.ReceivedBytes, ps.ReceivedBps = s.Receiver.Bytes, s.Receiver.BitsPerSecond
		}
		r.PerStream = append(r.PerStream, ps)
	}
	return r, nil
}

// parseIperf3UDP fills the UDP accounting. The server's "packets" is the highest sequence
// number it saw and "lost_packets" the gaps, so delivered = packets − lost. Without the
// server's JSON we fall back to the client's sum_received, which iperf3 fills from the
// server's end-of-test report (same numbers, no per-stream detail).
func parseIperf3UDP(d *iperf3Doc, r *Iperf3Result) {
	e := d.End
	recv := e.SumReceived
	var srvStreams []*iperf3Sum
	if so := d.ServerOutput; so != nil && so.End.SumReceived != nil {
		recv = so.End.SumReceived
		for _, s := range so.End.Streams {
			srvStreams = append(srvStreams, s.UDP)
		}
	}
	delivered := recv.Packets - recv.LostPackets
	u := &Iperf3UDP{
		PacketsSent:      e.SumSent.Packets,
		PacketsLost:      recv.LostPackets,
		PacketsDelivered: delivered,
		LostPercent:      recv.LostPercent,
		JitterMs:         recv.JitterMs,
	}
	if recv.Seconds > 0 {
		u.DeliveredPPS = float64(delivered) / recv.Seconds
	}
	r.ReceivedBytes, r.ReceivedBps = recv.Bytes, recv.BitsPerSecond
	for i, s := range e.Streams {
		var ps Iperf3Stream
		if s.UDP != nil {
			ps.SentBytes, ps.SentBps, ps.PacketsSent = s.UDP.Bytes, s.UDP.BitsPerSecond, s.UDP.Packets
			if srvStreams == nil {
				u.OutOfOrder += s.UDP.OutOfOrder
			}
		}
		// Server streams come in the same order as the client's. iperf3 3.12 reports 0 bytes
		// per stream on the server, so received bytes are packets × block size.
		if i < len(srvStreams) && srvStreams[i] != nil {
			ss := srvStreams[i]
			ps.PacketsLost = ss.LostPackets
			ps.PacketsDelivered = ss.Packets - ss.LostPackets
			ps.JitterMs = ss.JitterMs
			u.OutOfOrder += ss.OutOfOrder
			ps.ReceivedBytes = uint64(ps.PacketsDelivered) * uint64(r.Length)
			if ss.Seconds > 0 {
				ps.ReceivedBps = float64(ps.ReceivedBytes) * 8 / ss.Seconds
			}
		}
		r.PerStream = append(r.PerStream, ps)
	}
	r.UDP = u
}
