package inject

import (
	"fmt"
	"net"
)

// MAC is an Ethernet address held by value, so a Config can be copied and compared freely and
// round-trips through JSON as "02:00:00:00:00:01" (net.HardwareAddr would marshal as base64),
// which matters once the lead runs the injector as a separate process fed a JSON config.
type MAC [6]byte

// ParseMAC parses the usual colon or dash notation of a 48-bit address.
func ParseMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return MAC{}, err
	}
	if len(hw) != 6 {
		return MAC{}, fmt.Errorf("mac %q: want 6 bytes, got %d", s, len(hw))
	}
	var m MAC
	copy(m[:], hw)
	return m, nil
}

// MustMAC is ParseMAC for constants in tests and defaults; it panics on a malformed address.
func MustMAC(s string) MAC {
	m, err := ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// IsZero reports whether the address is unset.
func (m MAC) IsZero() bool { return m == MAC{} }

func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

func (m *MAC) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = MAC{}
		return nil
	}
	v, err := ParseMAC(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}
