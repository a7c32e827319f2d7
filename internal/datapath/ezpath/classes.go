package ezpath

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Priority classes weigh a pair's rate into its offload score (the orchestrator's pod priority
// and application type in the paper). "never" keeps a pair on the overlay.
var classWeights = map[string]float64{"critical": 8, "high": 4, "normal": 1, "low": 0.25, "never": 0}

// Classes maps a container (short name or overlay address) to its class.
type Classes map[string]string

// LoadClasses reads a class file: one "<container name or overlay IP> <class>" per line, '#'
// starts a comment. Classes: critical, high, normal (default), low, never.
func LoadClasses(path string) (Classes, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ezpath: class file: %w", err)
	}
	defer f.Close()
	c := Classes{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("ezpath: %s:%d: want \"<container or IP> <class>\", got %q", path, n, sc.Text())
		}
		if _, ok := classWeights[fields[1]]; !ok {
			return nil, fmt.Errorf("ezpath: %s:%d: unknown class %q (critical, high, normal, low, never)", path, n, fields[1])
		}
		c[fields[0]] = fields[1]
	}
	return c, sc.Err()
}

// of returns the class of a container (by name or address); normal when unlisted.
func (c Classes) of(e endpoint) string {
	if v, ok := c[e.Name]; ok {
		return v
	}
	if v, ok := c[e.Addr.String()]; ok {
		return v
	}
	return "normal"
}

// pairClass is the class of a pair: "never" on either side wins, else the higher of the two.
func (c Classes) pairClass(a, b endpoint) string {
	ca, cb := c.of(a), c.of(b)
	if ca == "never" || cb == "never" {
		return "never"
	}
	if classWeights[ca] >= classWeights[cb] {
		return ca
	}
	return cb
}
