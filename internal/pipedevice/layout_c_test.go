package pipedevice

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The shared-memory layout and the control protocol are written twice: here (layout.go, proto.go)
// and in libpd (pd_internal.h). A C program built from pd_internal.h prints every constant and
// every field offset libpd uses; each must equal the Go side's, and every #define of pd_internal.h's
// layout and protocol sections must be named here (a constant added on one side only fails too).
func TestLayoutMatchesLibpd(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("no C compiler: `cc` is not on PATH (%v). libpd is C; install one (Debian: apt-get install gcc, or ./scripts/setup.sh)", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	hdr := filepath.Join(root, "libpd", "pd_internal.h")

	// the C name of each Go constant
	goConst := map[string]int64{
		"HDR_PAGE": HdrPage, "QUEUE_HDR": QueueHdr, "ENTRY_SIZE": EntrySize, "SOCK_HDR": SockHdrSize,
		"MAX_CHUNK": MaxChunk, "PH_SLEEPING": PhSleeping,
		"SH_RX_TAIL": ShRxTail, "SH_RX_HEAD": ShRxHead, "SH_TX_LIMIT": ShTxLimit, "SH_TX_QUEUED": ShTxQueued,
		"SH_STATE": ShState, "SH_PENDING": ShPending, "SH_ERROR": ShError,
		"ST_CONNECTED": SockConnected, "ST_PEER_CLOSED": SockPeerClosed, "ST_CLOSED": SockClosed,
		"REQ_SEND": ReqSend, "REQ_SEND_DIRECT": ReqSendDirect, "REQ_RELEASE": ReqRelease, "REQ_COMPLETED": ReqCompleted,
		"OP_HELLO": OpHello, "OP_SOCKET": OpSocket, "OP_BIND": OpBind, "OP_LISTEN": OpListen, "OP_ACCEPT": OpAccept,
		"OP_CONNECT": OpConnect, "OP_CLOSE": OpClose, "OP_SEAL": OpSeal, "MSG": MsgSize,
		"CALL_TIMEOUT_S": int64(callTimeout.Seconds()),
		"SBT_SIZE":       sbtSize, // not shared memory, but entry_seq indexes it on both sides
	}
	// where each field lands in the bytes the Go side writes (a marker in one field at a time)
	for k, v := range goOffsets() {
		goConst[k] = v
	}

	// every #define between "/* layout.go" and MAX_EPOLL (libpd's own) must be named above
	src, err := os.ReadFile(hdr)
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	from, to := strings.Index(s, "/* layout.go"), strings.Index(s, "#define MAX_EPOLL")
	if from < 0 || to < from {
		t.Fatalf("%s: no \"/* layout.go\" ... #define MAX_EPOLL section; the test reads the shared constants from there", hdr)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^#define ([A-Z_0-9]+) `).FindAllStringSubmatch(s[from:to], -1) {
		if _, ok := goConst[m[1]]; !ok {
			t.Errorf("pd_internal.h defines %s, which this test does not compare with a Go constant: add it to goConst (and to layout.go or proto.go)", m[1])
		}
		names = append(names, m[1])
	}

	// the C side: each constant and each field offset as libpd's compiler sees it
	var prog bytes.Buffer
	prog.WriteString("#include \"pd_internal.h\"\n#include <stddef.h>\n#include <stdio.h>\nstruct pdi_state pdi_g;\nint main(void)\n{\n")
	for _, n := range names {
		fmt.Fprintf(&prog, "\tprintf(\"%s %%lld\\n\", (long long)(%s));\n", n, n)
	}
	for k := range goOffsets() {
		st, field, _ := strings.Cut(strings.TrimPrefix(k, "offsetof "), ".")
		fmt.Fprintf(&prog, "\tprintf(\"%s %%lld\\n\", (long long)offsetof(struct %s, %s));\n", k, st, field)
	}
	for _, st := range []string{"entry", "req", "rep"} {
		fmt.Fprintf(&prog, "\tprintf(\"sizeof %s %%lld\\n\", (long long)sizeof(struct %s));\n", st, st)
	}
	prog.WriteString("\treturn 0;\n}\n")
	goConst["sizeof entry"], goConst["sizeof req"], goConst["sizeof rep"] = EntrySize, MsgSize, MsgSize

	dir := t.TempDir()
	c, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(c, prog.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-I", filepath.Join(root, "libpd"), "-o", bin, c).CombinedOutput(); err != nil {
		t.Fatalf("compile the layout printer against %s (a constant or field this test expects is gone?): %v\n%s\n%s", hdr, err, b, prog.String())
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("layout printer: %q", line)
		}
		k, v := line[:i], line[i+1:]
		cv, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("layout printer: %q", line)
		}
		seen[k] = true
		if gv, ok := goConst[k]; !ok {
			t.Errorf("C %s = %d has no Go counterpart", k, cv)
		} else if gv != cv {
			t.Errorf("%s: C (libpd/pd_internal.h) says %d, Go (internal/pipedevice) says %d: change both together", k, cv, gv)
		}
	}
	var missing []string
	for k := range goConst {
		if !seen[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("Go constants with no C counterpart in pd_internal.h's shared sections: %s", strings.Join(missing, ", "))
	}
	t.Logf("%d constants and offsets compared", len(seen))
}

// goOffsets finds where the Go side puts each field of a queue entry, a request and a reply, by
// writing a marker into one field at a time; keys name the C struct and field.
func goOffsets() map[string]int64 {
	first := func(b []byte) int64 {
		for i, x := range b {
			if x != 0 {
				return int64(i)
			}
		}
		return -1
	}
	off := map[string]int64{}
	entry := func(field string, set func(*Entry)) {
		var e Entry
		set(&e)
		b := make([]byte, EntrySize)
		e.put(b)
		off["offsetof entry."+field] = first(b)
	}
	entry("type", func(e *Entry) { e.Type = 1 })
	entry("table_id", func(e *Entry) { e.TableID = 1 })
	entry("data_len", func(e *Entry) { e.DataLen = 1 })
	entry("src", func(e *Entry) { e.Src = 1 })
	entry("dst", func(e *Entry) { e.Dst = 1 })
	entry("cid", func(e *Entry) { e.CID = 1 })
	entry("conn_id", func(e *Entry) { e.ConnID = 1 })
	entry("entry_seq", func(e *Entry) { e.EntrySeq = 1 })
	entry("status", func(e *Entry) { e.Status = 1 })
	off["offsetof entry.seq"] = 0 // queue.go publishes the slot's sequence in its first word

	req := func(field string, r Request) { off["offsetof req."+field] = first(r.marshal()) }
	req("op", Request{Op: 1})
	req("sid", Request{SID: 1})
	req("a0", Request{A0: 1})
	req("a1", Request{A1: 1})
	req("a2", Request{A2: 1})
	req("addr", Request{Addr: [4]byte{1}})
	req("port_be", Request{Port: 0x100})

	rep := func(field string, r Reply) { off["offsetof rep."+field] = first(r.marshal()) }
	rep("err", Reply{Err: 1})
	rep("sid", Reply{SID: 1})
	rep("v", Reply{V: [6]uint32{1}})
	rep("w", Reply{W: [2]uint64{1}})
	rep("addr", Reply{Addr: [4]byte{1}})
	rep("port_be", Reply{Port: 0x100})
	return off
}
