// Package cpuset reads and writes CPU sets in the forms Linux uses: lists ("0-3,5", as
// /sys/devices/system/cpu/online and taskset print them) and hex masks ("f", "00000001,00000000",
// as rps_cpus takes them). Every set it returns is ascending and free of duplicates.
package cpuset

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Parse reads a CPU list such as "1", "0-3" or "0,2-3,8". An empty list is an error.
func Parse(s string) ([]int, error) {
	bad := fmt.Errorf("%q is not a CPU list like 0-3,5", s)
	if strings.TrimSpace(s) == "" {
		return nil, bad
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, bad
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, bad
			}
		}
		if b-a > 1<<16 {
			return nil, fmt.Errorf("%q: range %s is implausibly large", s, part)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return Normalize(out), nil
}

// Normalize returns the set ascending and without duplicates (a copy).
func Normalize(cpus []int) []int {
	out := slices.Clone(cpus)
	slices.Sort(out)
	return slices.Compact(out)
}

// Format renders a set as a CPU list with ranges ("0-3,5"), the form Parse reads; "" for none.
func Format(cpus []int) string {
	s := Normalize(cpus)
	var parts []string
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		switch {
		case j == i:
			parts = append(parts, strconv.Itoa(s[i]))
		case j == i+1:
			parts = append(parts, strconv.Itoa(s[i]), strconv.Itoa(s[j]))
		default:
			parts = append(parts, fmt.Sprintf("%d-%d", s[i], s[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// Mask renders a set as the hex bitmap sysfs takes (rps_cpus, xps_cpus): comma-separated 32-bit
// words, most significant first, the first without leading zeros ("3", "1,00000000"); "0" for
// none.
func Mask(cpus []int) string {
	top := 0
	for _, c := range cpus {
		top = max(top, c)
	}
	words := make([]uint32, top/32+1)
	for _, c := range cpus {
		if c >= 0 {
			words[c/32] |= 1 << (c % 32)
		}
	}
	parts := []string{fmt.Sprintf("%x", words[len(words)-1])}
	for i := len(words) - 2; i >= 0; i-- {
		parts = append(parts, fmt.Sprintf("%08x", words[i]))
	}
	return strings.Join(parts, ",")
}

// FromMask decodes a hex bitmap ("3", "00000000,00000003", "0").
func FromMask(m string) ([]int, error) {
	var cpus []int
	words := strings.Split(strings.TrimSpace(m), ",")
	for wi := range words {
		w, err := strconv.ParseUint(words[len(words)-1-wi], 16, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CPU mask like 3 or 00000001,00000000", m)
		}
		for b := 0; b < 32; b++ {
			if w&(1<<b) != 0 {
				cpus = append(cpus, wi*32+b)
			}
		}
	}
	return cpus, nil
}

// SameMask compares two masks by value ("00000003" and "3" are the same set).
func SameMask(a, b string) bool {
	x, errA := FromMask(a)
	y, errB := FromMask(b)
	return errA == nil && errB == nil && slices.Equal(x, y)
}

// Online lists the online CPUs (/sys/devices/system/cpu/online; without sysfs, 0..NumCPU-1).
func Online() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		out := make([]int, runtime.NumCPU())
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	return Parse(strings.TrimSpace(string(b)))
}

// CheckOnline says which CPU of the set is offline or absent, if any.
func CheckOnline(cpus []int) error {
	online, err := Online()
	if err != nil {
		return err
	}
	for _, c := range cpus {
		if !slices.Contains(online, c) {
			return fmt.Errorf("CPU %d is offline or absent (online: %s)", c, Format(online))
		}
	}
	return nil
}
