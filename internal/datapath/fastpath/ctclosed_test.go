package fastpath

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
)

// fakeRing serves queued records; an empty ring with a deadline says so, one without ends.
type fakeRing struct {
	recs     [][]byte
	deadline time.Time
	end      func()
}

func (r *fakeRing) SetDeadline(t time.Time) { r.deadline = t }

func (r *fakeRing) ReadInto(rec *ringbuf.Record) error {
	if len(r.recs) == 0 {
		if r.deadline.IsZero() {
			r.end()
			return os.ErrClosed
		}
		return os.ErrDeadlineExceeded
	}
	rec.RawSample, r.recs = r.recs[0], r.recs[1:]
	return nil
}

func closedRecord(i int, at uint64) []byte {
	b := make([]byte, sizeofClosed)
	binary.NativeEndian.PutUint32(b[0:], 0x0201a8c0)
	binary.NativeEndian.PutUint32(b[4:], 0x0202a8c0)
	binary.NativeEndian.PutUint16(b[8:], uint16(i))
	binary.NativeEndian.PutUint16(b[10:], 0x5000)
	b[12] = 6
	binary.NativeEndian.PutUint64(b[16:], at)
	return b
}

// The agent sends the closed connections in batches of at most closedBatchMax, every record
// once and in order; a short record is skipped.
func TestDrainClosed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &fakeRing{end: cancel}
	at := monoNs() - uint64(30*time.Millisecond)
	const n = 600
	for i := range n {
		r.recs = append(r.recs, closedRecord(i, at))
		if i == 10 {
			r.recs = append(r.recs, []byte{1, 2, 3})
		}
	}
	var got []ctTuple
	var sizes []int
	drainClosed(ctx, r, func(ts []ctTuple, lag time.Duration) {
		sizes = append(sizes, len(ts))
		got = append(got, ts...)
		if lag < 30*time.Millisecond || lag > time.Minute {
			t.Errorf("lag %v, want the 30 ms since the records' close", lag)
		}
	})
	if len(got) != n {
		t.Fatalf("%d tuples sent, want %d (batches %v)", len(got), n, sizes)
	}
	for i, tu := range got {
		if tu.sport != uint16(i) || tu.src != 0x0201a8c0 || tu.dst != 0x0202a8c0 || tu.dport != 0x5000 || tu.proto != 6 {
			t.Fatalf("tuple %d: %+v", i, tu)
		}
	}
	for _, s := range sizes {
		if s > closedBatchMax {
			t.Fatalf("a batch of %d (max %d): %v", s, closedBatchMax, sizes)
		}
	}
	if _, _, ok := parseClosed(make([]byte, sizeofClosed-1)); ok {
		t.Fatal("a short record parsed")
	}
}
