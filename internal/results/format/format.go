// Package format renders measured values with human units ("12.3 Gbps", "412 kpps"). It sits
// beside internal/results so that the report and the bench's progress lines print a value the
// same way without the bench importing the report.
package format

import (
	"math"
	"strconv"

	"github.com/peregrine-net/peregrine/internal/results"
)

// Scale is a display unit: values are divided by Div and suffixed with Name.
type Scale struct {
	Div  float64
	Name string
}

// For picks a human unit for a metric from a representative magnitude (the largest value
// shown), so one column or one axis uses one unit throughout.
func For(metric string, mag float64) Scale {
	mag = math.Abs(mag)
	switch results.UnitOf(metric) {
	case results.UnitBitsPerSec:
		return pick(mag, Scale{1e9, "Gbps"}, Scale{1e6, "Mbps"}, Scale{1e3, "kbps"}, Scale{1, "bps"})
	case results.UnitPktsPerSec:
		return pick(mag, Scale{1e6, "Mpps"}, Scale{1e3, "kpps"}, Scale{1, "pps"})
	case results.UnitReqsPerSec:
		return pick(mag, Scale{1e6, "Mreq/s"}, Scale{1e3, "kreq/s"}, Scale{1, "req/s"})
	case results.UnitMicrosecond:
		return pick(mag, Scale{1e6, "s"}, Scale{1e3, "ms"}, Scale{1, "µs"})
	case results.UnitNanosecond:
		return pick(mag, Scale{1e6, "ms"}, Scale{1e3, "µs"}, Scale{1, "ns"})
	case results.UnitBytes:
		return pick(mag, Scale{1 << 30, "GiB"}, Scale{1 << 20, "MiB"}, Scale{1 << 10, "KiB"}, Scale{1, "B"})
	case results.UnitFraction:
		return Scale{0.01, "%"}
	case results.UnitCores:
		return Scale{1, "cores"}
	}
	return pick(mag, Scale{1e9, "G"}, Scale{1e6, "M"}, Scale{1e3, "k"}, Scale{1, ""})
}

// pick returns the first scale (largest first) whose divisor the magnitude reaches.
func pick(mag float64, ss ...Scale) Scale {
	for _, s := range ss {
		if mag >= s.Div {
			return s
		}
	}
	return ss[len(ss)-1]
}

// Num formats a scaled value with three significant digits, which is all the precision a noisy
// benchmark has.
func Num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// With joins a formatted number and the unit's name ("12.3 Gbps", "45%", "3.2k").
func (s Scale) With(v string) string {
	switch s.Name {
	case "":
		return v
	case "%", "k", "M", "G":
		return v + s.Name
	}
	return v + " " + s.Name
}

// Value renders one measured value with a human unit ("12.3 Gbps", "412 kpps").
func Value(metric string, v float64) string {
	s := For(metric, v)
	return s.With(Num(v / s.Div))
}
