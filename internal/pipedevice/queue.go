package pipedevice

import "sync/atomic"

// Queue is a bounded lock-free FIFO of 32-byte entries in shared memory (a submission or
// completion queue). Every slot carries a sequence number (the entry's first word), so several
// producers (threads of one process on one core, or the daemon posting a close) and a consumer
// need no lock: a producer claims slots by compare-and-swap on the tail, writes them and then
// publishes each by storing its sequence; the consumer takes a slot only once it is published.
// libpd implements the same algorithm in C over the same bytes.
//
//	[0,8) u64 tail (next slot to claim) | [64,72) u64 head (next slot to consume) | entries
type Queue struct {
	mem   []byte
	depth uint64
	mask  uint64
}

// NewQueue views mem (QueueHdr + depth*EntrySize bytes) as a queue; depth is a power of two.
func NewQueue(mem []byte, depth int) *Queue {
	return &Queue{mem: mem, depth: uint64(depth), mask: uint64(depth - 1)}
}

// Init writes the empty state (only the owner of fresh memory does this).
func (q *Queue) Init() {
	store64(q.mem, 0, 0)
	store64(q.mem, 64, 0)
	for i := uint64(0); i < q.depth; i++ {
		store32(q.mem, q.slot(i), uint32(i))
	}
}

func (q *Queue) slot(pos uint64) int { return QueueHdr + int(pos&q.mask)*EntrySize }

// pushTries bounds Push's retries: the queue lives in memory a client can write, so a corrupted
// slot sequence must not keep the daemon (or the engine) spinning forever.
const pushTries = 1 << 16

// Push enqueues all of es or nothing (false: not enough free slots, or the queue's memory is
// corrupt).
func (q *Queue) Push(es ...Entry) bool {
	n := uint64(len(es))
	if n == 0 {
		return true
	}
	if n > q.depth {
		return false
	}
	for try := 0; try < pushTries; try++ {
		pos := load64(q.mem, 0)
		// Slots are freed in order by the single consumer, so if the last slot we need is free
		// for this lap, so are the ones before it.
		last := pos + n - 1
		seq := load32(q.mem, q.slot(last))
		d := int32(seq - uint32(last))
		if d < 0 {
			return false // full
		}
		if d > 0 {
			continue // another producer moved on; reload the tail
		}
		if !atomic.CompareAndSwapUint64(u64At(q.mem, 0), pos, pos+n) {
			continue
		}
		for i := uint64(0); i < n; i++ {
			off := q.slot(pos + i)
			es[i].put(q.mem[off : off+EntrySize])
			store32(q.mem, off, uint32(pos+i+1)) // publish
		}
		return true
	}
	return false
}

// Pop dequeues one entry (single consumer per queue).
func (q *Queue) Pop(e *Entry) bool {
	pos := load64(q.mem, 64)
	off := q.slot(pos)
	if load32(q.mem, off) != uint32(pos+1) {
		return false
	}
	e.get(q.mem[off : off+EntrySize])
	store32(q.mem, off, uint32(pos+q.depth)) // free for the next lap
	store64(q.mem, 64, pos+1)
	return true
}

// Free says how many slots a producer could claim now.
func (q *Queue) Free() int {
	return int(q.depth - (load64(q.mem, 0) - load64(q.mem, 64)))
}

// Len is the number of claimed, not yet consumed slots.
func (q *Queue) Len() int { return int(load64(q.mem, 0) - load64(q.mem, 64)) }
