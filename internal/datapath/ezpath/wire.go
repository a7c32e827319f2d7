package ezpath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// nbo is an IPv4 address as the programs keep it: the wire's bytes, loaded as a native u32.
func nbo(a netip.Addr) uint32 {
	b := a.As4()
	return binary.LittleEndian.Uint32(b[:])
}

// fromNBO is nbo backwards.
func fromNBO(v uint32) netip.Addr {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func mac6(m net.HardwareAddr) (out [6]uint8) {
	copy(out[:], m)
	return out
}

// Verdicts as BPF_PROG_TEST_RUN reports them.
const (
	verdictNext     = ^uint32(0) // TCX_NEXT (-1)
	verdictShot     = 2
	verdictRedirect = 7
)

// timeNow is the clock (a variable so tests can see what the tables saw).
var timeNow = time.Now

func fmtSscan(s string, v *uint64) (int, error) { return fmt.Sscan(s, v) }
