package pipedevice

import (
	"bytes"
	"math/rand"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func newTestQueue(t *testing.T, depth int) *Queue {
	t.Helper()
	q := NewQueue(make([]byte, QueueHdr+depth*EntrySize), depth)
	q.Init()
	return q
}

func TestEntryLayoutIs32Bytes(t *testing.T) {
	e := Entry{Type: ReqSend, TableID: 7, DataLen: 0xBEEF, Src: 0x0102030405060708, Dst: 0x1112131415161718,
		CID: 0x2122, ConnID: 0x3132, EntrySeq: 0x4142, Status: 0x5152}
	b := make([]byte, EntrySize)
	e.put(b)
	want := []byte{0, 0, 0, 0, ReqSend, 7, 0xEF, 0xBE,
		8, 7, 6, 5, 4, 3, 2, 1, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
		0x22, 0x21, 0x32, 0x31, 0x42, 0x41, 0x52, 0x51}
	if !bytes.Equal(b, want) {
		t.Fatalf("entry bytes\n got %x\nwant %x", b, want)
	}
	var back Entry
	back.get(b)
	if back != e {
		t.Fatalf("round trip: %+v != %+v", back, e)
	}
}

// The queue keeps FIFO order across many laps of its slots (sequence numbers wrap the ring).
func TestQueueWrapAround(t *testing.T) {
	q := newTestQueue(t, 64)
	var next, want uint64
	var e Entry
	for lap := 0; lap < 100; lap++ {
		// a batch of a size that does not divide the depth, so batches straddle the end
		for i := 0; i < 37; i++ {
			if !q.Push(Entry{Src: next}) {
				t.Fatalf("lap %d: push %d failed with %d queued", lap, next, q.Len())
			}
			next++
		}
		for q.Pop(&e) {
			if e.Src != want {
				t.Fatalf("popped %d, want %d", e.Src, want)
			}
			want++
		}
	}
	if want != 3700 || q.Len() != 0 || q.Free() != 64 {
		t.Fatalf("after 3700 entries: popped %d, len %d, free %d", want, q.Len(), q.Free())
	}
}

func TestQueueFull(t *testing.T) {
	q := newTestQueue(t, 64)
	for i := 0; i < 60; i++ {
		if !q.Push(Entry{Src: uint64(i)}) {
			t.Fatalf("push %d failed", i)
		}
	}
	// a batch is all or nothing: 5 do not fit in the 4 free slots, and nothing is queued
	if q.Push(make([]Entry, 5)...) {
		t.Fatal("a batch larger than the free space was accepted")
	}
	if q.Len() != 60 || q.Free() != 4 {
		t.Fatalf("len %d free %d after a refused batch", q.Len(), q.Free())
	}
	if !q.Push(make([]Entry, 4)...) {
		t.Fatal("a batch that fits exactly was refused")
	}
	if q.Push(Entry{}) {
		t.Fatal("push into a full queue succeeded")
	}
	if q.Push(make([]Entry, 65)...) {
		t.Fatal("a batch larger than the queue was accepted")
	}
	var e Entry
	if !q.Pop(&e) || e.Src != 0 {
		t.Fatalf("first pop: %+v", e)
	}
	if !q.Push(Entry{Src: 99}) {
		t.Fatal("push after a pop failed")
	}
	n := 0
	for q.Pop(&e) {
		n++
	}
	if n != 64 || e.Src != 99 {
		t.Fatalf("drained %d, last %d", n, e.Src)
	}
	if q.Pop(&e) {
		t.Fatal("pop from an empty queue")
	}
}

// Several producers (threads of one process sharing a core's queue) and one consumer (the
// engine): every entry arrives exactly once, each producer's entries in its order, batches
// contiguous.
func TestQueueConcurrentProducers(t *testing.T) {
	q := newTestQueue(t, 256)
	const producers, per = 8, 20000
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(p)))
			for i := 0; i < per; {
				k := 1 + r.Intn(4)
				if i+k > per {
					k = per - i
				}
				batch := make([]Entry, k)
				for j := range batch {
					batch[j] = Entry{CID: uint16(p), Src: uint64(i + j), DataLen: uint16(k), EntrySeq: uint16(j)}
				}
				for !q.Push(batch...) {
					// full: the consumer drains
				}
				i += k
			}
		}(p)
	}
	next := make([]uint64, producers)
	var e Entry
	got := 0
	var inBatch *Entry
	for got < producers*per {
		if !q.Pop(&e) {
			continue
		}
		got++
		if int(e.CID) >= producers {
			t.Fatalf("entry from producer %d", e.CID)
		}
		if e.Src != next[e.CID] {
			t.Fatalf("producer %d: got entry %d, want %d", e.CID, e.Src, next[e.CID])
		}
		next[e.CID]++
		// batches are contiguous: entry j of a batch follows entry j-1 of the same batch
		if e.EntrySeq > 0 && (inBatch == nil || inBatch.CID != e.CID || inBatch.EntrySeq != e.EntrySeq-1) {
			t.Fatalf("batch of producer %d interleaved", e.CID)
		}
		cp := e
		inBatch = &cp
	}
	wg.Wait()
	if q.Pop(&e) {
		t.Fatal("extra entry")
	}
}

// A client can write anything into its queues; the daemon's pushes must give up, not spin.
func TestQueueCorruptSequenceDoesNotSpin(t *testing.T) {
	q := newTestQueue(t, 64)
	for i := 0; i < 64; i++ {
		store32(q.mem, QueueHdr+i*EntrySize, 0xdeadbeef) // every slot "from a future lap"
	}
	if q.Push(Entry{}) {
		t.Fatal("push into a corrupted queue succeeded")
	}
	store64(q.mem, 64, 1<<60) // consumer head far away
	var e Entry
	q.Pop(&e) // must not fault: slot index is masked
}

func TestCopyRingWraps(t *testing.T) {
	src := make([]byte, 64)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, 16)
	// 10 bytes from source position 60 (wraps at 64) to destination position 12 (wraps at 16)
	copyRing(dst, 12+16*5, src, 60+64*3, 10)
	want := []byte{0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 60, 61, 62, 63}
	if !bytes.Equal(dst, want) {
		t.Fatalf("got %v want %v", dst, want)
	}
}

func TestMapMirrorIsContiguous(t *testing.T) {
	m, err := NewMemfd("prg-pd-test", 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mir, err := MapMirror(m.FD, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mir)
	copy(m.Mem[4090:], "abcdef")
	copy(m.Mem[0:], "ghij")
	if got := string(mir[4090:4100]); got != "abcdefghij" {
		t.Fatalf("wrapped bytes read %q through the mirror", got)
	}
	mir[4096+8] = 'Z'
	if m.Mem[8] != 'Z' {
		t.Fatal("a write to the second copy did not reach the ring")
	}
	// the file is sealed: a client cannot shrink it under the daemon's mapping
	if err := unix.Ftruncate(m.FD, 0); err == nil {
		t.Fatal("truncating a sealed ring succeeded")
	}
}

// The control memory layout is a contract with libpd: offsets are spelled out here.
func TestCtlLayout(t *testing.T) {
	l := CtlLayout{NQ: 2, QDepth: 1024, MaxSock: 8}
	qb := QueueHdr + 1024*32
	if l.SQOff(0) != 4096 || l.CQOff(0) != 4096+qb || l.SQOff(1) != 4096+2*qb || l.SockOff(0) != 4096+4*qb || l.SockOff(3) != 4096+4*qb+3*64 {
		t.Fatalf("layout moved: %d %d %d %d", l.SQOff(0), l.CQOff(0), l.SQOff(1), l.SockOff(0))
	}
	if l.Size()%4096 != 0 || l.Size() < l.SockOff(8) {
		t.Fatalf("size %d", l.Size())
	}
}
