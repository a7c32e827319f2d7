package udpsink

import "time"

// Stats is what one sink run saw.
type Stats struct {
	Received uint64  `json:"received"` // datagrams delivered to the socket
	Bytes    uint64  `json:"bytes"`    // their UDP payload bytes
	PPS      float64 `json:"pps"`      // Received over Active (first to last datagram)
	// Sequence accounting over datagrams carrying the injector's payload header, per flow
	// (source address and port + flow id).
	Lost uint64 `json:"lost"` // sequence numbers skipped and never filled in
	// Expected is the sequence numbers spanned, first to highest seen per flow. A lost tail
	// (after a flow's last delivered datagram) is outside it: the sender's count minus Expected.
	Expected    uint64          `json:"expected"`
	Reordered   uint64          `json:"reordered"`  // arrived below the flow's highest sequence so far
	Duplicates  uint64          `json:"duplicates"` // a sequence number seen before
	Flows       int             `json:"flows"`
	Foreign     uint64          `json:"foreign"` // datagrams without our payload header (not sequence-tracked)
	ReorderHist []ReorderBucket `json:"reorder_histogram"`
	// The kernel's view of drops during the run. SocketDrops is this socket's own (SO_MEMINFO);
	// the Udp MIB deltas cover the whole namespace.
	SocketDrops  uint64        `json:"socket_drops"`
	RcvbufErrors uint64        `json:"rcvbuf_errors"`
	InErrors     uint64        `json:"in_errors"`
	MemErrors    uint64        `json:"mem_errors"`
	RcvBuf       int           `json:"rcvbuf"`     // the receive buffer the kernel granted (bytes, as SO_RCVBUF reports)
	Elapsed      time.Duration `json:"elapsed_ns"` // the whole run
	Active       time.Duration `json:"active_ns"`  // first to last datagram
	CPU          int           `json:"cpu"`        // receive thread pin, -1 if unpinned
}
