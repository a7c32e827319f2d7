package fastpath

import (
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The DESTROY events of the entries the programs expired at a fast-path close (closedFast:
// TCP, IPS_FIXED_TIMEOUT, bpf/fastpath_closed.h) carry nothing the agent acts on, but there is
// one per short connection and node: measured on the k8s lab (TCP_CRR at ~1.7 k connections/s,
// perf -a -g), each agent woke for every one of them, and the Go runtime's wake-up of a
// process that had gone idle (netpoll, the scheduler, sysmon's 20 µs polling restarted each
// time) cost more than the read: the two agents together took ~8 % of the 2-vCPU machine,
// ~100 µs of CPU per connection, about what the fast path saved in the receive softirq. So the
// subscription carries a classic BPF socket filter that drops those events in the kernel
// (do_one_broadcast runs it before queuing): the socket is not woken for them. Every other
// event, and any message the filter does not understand, passes; receiveConntrack still skips
// a closedFast event that got through (a kernel without the filter, a layout it missed).
//
// The filter drops one more kind (ctEnded): a TCP entry destroyed in TIME_WAIT or CLOSE, whose
// connection ended through conntrack. No cached flow needs it: a new connection on its tuple
// begins with a SYN, which always takes the normal path and re-learns the flow (syn_open,
// bpf/fastpath.h); and the usual way such an entry goes is exactly that SYN reopening the tuple
// (nf_conntrack_proto_tcp.c kills the old entry), so the event, read ~10 ms later, made the NEW
// connection's flow due. Measured on the k8s lab: once the client's ports wrapped onto the
// TIME_WAIT entries of earlier connections (a compare run's vanilla reps; on a node, any
// connection closed on the normal path), nearly every short connection cost the agent an event
// again (the agents' CPU grew from attachment to attachment: 0.40, 0.57, 0.93 s per 8 s).

// Conntrack's TCP states of a connection that is over (enum tcp_conntrack).
const (
	ctTCPTimeWait = 7 // TCP_CONNTRACK_TIME_WAIT
	ctTCPClose    = 8 // TCP_CONNTRACK_CLOSE
)

// ctFilterSteps is how many attributes a level of the filter's walk looks at: the kernel puts
// CTA_STATUS after the two tuples, the zone and the id (ctnetlink_conntrack_event), and the
// protocol inside the original tuple after the addresses; a DESTROY event's CTA_PROTOINFO
// follows the counters and the timestamp (where conntrack keeps them).
const ctFilterSteps = 10

// Scratch slots of the filter.
const (
	fsCur = iota // the attribute the walk is at (its offset)
	fsEnd        // the end of the level being walked (the message, or a nested attribute)
	fsTmp        // the length's high byte
	fsLen        // the attribute's length
)

// cbpf is a tiny assembler of classic BPF with symbolic jump targets. A conditional jump
// reaches 255 instructions at most and the program is longer, so every branch is "if cond goto
// label, else fall through": a conditional jump over one unconditional jump (32-bit offset).
type cbpf struct {
	ins    []bpf.Instruction
	labels map[string]int
	fix    map[int]string // unconditional jumps and their labels, resolved at the end
}

func (p *cbpf) emit(in ...bpf.Instruction) { p.ins = append(p.ins, in...) }

func (p *cbpf) label(l string) { p.labels[l] = len(p.ins) }

// jumpTo goes to label l if A cond val (against X where x), and on otherwise.
func (p *cbpf) jumpTo(cond bpf.JumpTest, val uint32, x bool, l string) {
	if x {
		p.emit(bpf.JumpIfX{Cond: cond, SkipTrue: 0, SkipFalse: 1})
	} else {
		p.emit(bpf.JumpIf{Cond: cond, Val: val, SkipTrue: 0, SkipFalse: 1})
	}
	p.goTo(l)
}

// goTo emits an unconditional jump to label l.
func (p *cbpf) goTo(l string) {
	p.fix[len(p.ins)] = l
	p.emit(bpf.Jump{})
}

func (p *cbpf) resolve() ([]bpf.Instruction, error) {
	for at, l := range p.fix {
		to, ok := p.labels[l]
		if !ok || to <= at {
			return nil, fmt.Errorf("conntrack event filter: label %q missing or backwards", l)
		}
		p.ins[at] = bpf.Jump{Skip: uint32(to - at - 1)}
	}
	return p.ins, nil
}

// find walks the attributes of one level, from X (an offset) to scratch fsEnd, for the first
// of type typ (the nested and byte-order flags masked off), at most
// ctFilterSteps of them. Found, it falls through with X at the attribute and fsLen its
// length, checked to hold a payload of at least minLen bytes inside the level; otherwise (not
// there, a truncated or malformed attribute) it jumps to far. Netlink attributes are host
// order (little-endian here) and classic BPF loads big-endian: the length is read byte by byte.
func (p *cbpf) find(name string, typ uint8, minLen uint32, far string) {
	miss := name + "-miss" // within reach of every step's jumps, which far may not be
	for i := 0; i < ctFilterSteps; i++ {
		p.emit(
			bpf.StoreScratch{Src: bpf.RegX, N: fsCur},
			bpf.TXA{}, bpf.ALUOpConstant{Op: bpf.ALUOpAdd, Val: unix.SizeofNlAttr}, bpf.TAX{}, // X = cur+4
			bpf.LoadScratch{Dst: bpf.RegA, N: fsEnd},
		)
		p.jumpTo(bpf.JumpLessThan, 0, true, miss) // end < cur+4: no header there
		p.emit(
			bpf.LoadScratch{Dst: bpf.RegX, N: fsCur},
			bpf.LoadIndirect{Off: 1, Size: 1}, bpf.ALUOpConstant{Op: bpf.ALUOpShiftLeft, Val: 8},
			bpf.StoreScratch{Src: bpf.RegA, N: fsTmp},
			bpf.LoadIndirect{Off: 0, Size: 1}, bpf.LoadScratch{Dst: bpf.RegX, N: fsTmp},
			bpf.ALUOpX{Op: bpf.ALUOpOr}, // A = the attribute's length
		)
		p.jumpTo(bpf.JumpLessThan, unix.SizeofNlAttr, false, miss)
		p.emit(
			bpf.StoreScratch{Src: bpf.RegA, N: fsLen},
			bpf.LoadScratch{Dst: bpf.RegX, N: fsCur},
			bpf.ALUOpX{Op: bpf.ALUOpAdd}, bpf.TAX{}, // X = cur+len
			bpf.LoadScratch{Dst: bpf.RegA, N: fsEnd},
		)
		p.jumpTo(bpf.JumpLessThan, 0, true, miss) // the attribute runs past its level
		// The type, read big-endian: its low byte, then the high one with the nested and
		// byte-order flags (0xc0) masked off.
		p.emit(bpf.LoadScratch{Dst: bpf.RegX, N: fsCur}, bpf.LoadIndirect{Off: 2, Size: 2},
			bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xff3f})
		p.jumpTo(bpf.JumpEqual, uint32(typ)<<8, false, name+"-hit")
		p.emit(
			bpf.LoadScratch{Dst: bpf.RegA, N: fsLen},
			bpf.ALUOpConstant{Op: bpf.ALUOpAdd, Val: unix.NLA_ALIGNTO - 1},
			bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: ^uint32(unix.NLA_ALIGNTO - 1)},
			bpf.ALUOpX{Op: bpf.ALUOpAdd}, bpf.TAX{}, // X = the next attribute
		)
	}
	p.label(miss)
	p.goTo(far)
	p.label(name + "-hit")
	p.emit(bpf.LoadScratch{Dst: bpf.RegA, N: fsLen})
	p.jumpTo(bpf.JumpLessThan, unix.SizeofNlAttr+minLen, false, far)
}

// ctDestroyFilter is the socket filter of the DESTROY subscription: 0 (drop) for the DELETE
// message of a TCP entry whose CTA_STATUS has IPS_FIXED_TIMEOUT (closedFast) or whose TCP state
// (CTA_PROTOINFO_TCP_STATE, which DESTROY events carry) is TIME_WAIT or CLOSE (ctEnded), the
// whole message for anything else.
func ctDestroyFilter() ([]bpf.RawInstruction, error) {
	p := &cbpf{labels: map[string]int{}, fix: map[int]string{}}
	const keep, drop, ended = "keep", "drop", "ended"
	const hdr = unix.SizeofNlMsghdr + sizeofNfgenmsg
	// A ctnetlink DELETE message (the type is host order: byte 4 the message, 5 the subsystem),
	// long enough for its headers.
	p.emit(bpf.LoadExtension{Num: bpf.ExtLen})
	p.jumpTo(bpf.JumpLessThan, hdr, false, keep)
	p.emit(bpf.LoadAbsolute{Off: 4, Size: 1})
	p.jumpTo(bpf.JumpNotEqual, ipctnlMsgCTDel, false, keep)
	p.emit(bpf.LoadAbsolute{Off: 5, Size: 1})
	p.jumpTo(bpf.JumpNotEqual, unix.NFNL_SUBSYS_CTNETLINK, false, keep)
	// The top level: the message's attributes, up to the packet's end.
	top := func() {
		p.emit(bpf.LoadExtension{Num: bpf.ExtLen}, bpf.StoreScratch{Src: bpf.RegA, N: fsEnd},
			bpf.LoadConstant{Dst: bpf.RegX, Val: hdr})
	}
	nested := func() { // the level inside the attribute X is at (length fsLen)
		p.emit(bpf.TXA{}, bpf.LoadScratch{Dst: bpf.RegX, N: fsLen}, bpf.ALUOpX{Op: bpf.ALUOpAdd},
			bpf.StoreScratch{Src: bpf.RegA, N: fsEnd},
			bpf.LoadScratch{Dst: bpf.RegA, N: fsCur}, bpf.ALUOpConstant{Op: bpf.ALUOpAdd, Val: unix.SizeofNlAttr}, bpf.TAX{})
	}
	// closedFast: IPS_FIXED_TIMEOUT and TCP.
	top()
	p.find("status", 3 /* CTA_STATUS */, 4, ended)
	p.emit(bpf.LoadIndirect{Off: unix.SizeofNlAttr, Size: 4}) // big-endian, as the kernel writes it
	p.jumpTo(bpf.JumpBitsNotSet, ipsFixedTimeout, false, ended)
	top()
	p.find("orig", 1 /* CTA_TUPLE_ORIG */, 0, ended)
	nested()
	p.find("proto", 2 /* CTA_TUPLE_PROTO */, 0, ended)
	nested()
	p.find("num", 1 /* CTA_PROTO_NUM */, 1, ended)
	p.emit(bpf.LoadIndirect{Off: unix.SizeofNlAttr, Size: 1})
	p.jumpTo(bpf.JumpEqual, unix.IPPROTO_TCP, false, drop)
	// ctEnded: a TCP state past the connection's end (only TCP's protoinfo has CTA_PROTOINFO_TCP).
	p.label(ended)
	top()
	p.find("pinfo", 4 /* CTA_PROTOINFO */, 0, keep)
	nested()
	p.find("tcp", 1 /* CTA_PROTOINFO_TCP */, 0, keep)
	nested()
	p.find("state", 1 /* CTA_PROTOINFO_TCP_STATE */, 1, keep)
	p.emit(bpf.LoadIndirect{Off: unix.SizeofNlAttr, Size: 1})
	p.jumpTo(bpf.JumpEqual, ctTCPTimeWait, false, drop)
	p.jumpTo(bpf.JumpEqual, ctTCPClose, false, drop)
	p.goTo(keep)
	p.label(drop)
	p.emit(bpf.RetConstant{Val: 0})
	p.label(keep)
	p.emit(bpf.RetConstant{Val: 0xffffffff})
	ins, err := p.resolve()
	if err != nil {
		return nil, err
	}
	return bpf.Assemble(ins)
}

// attachCTFilter puts ctDestroyFilter on the netlink socket fd.
func attachCTFilter(fd int) error {
	raw, err := ctDestroyFilter()
	if err != nil {
		return err
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]})
}
