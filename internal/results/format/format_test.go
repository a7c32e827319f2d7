package format

import (
	"math"
	"testing"
)

func TestValue(t *testing.T) {
	for _, c := range []struct {
		metric string
		v      float64
		want   string
	}{
		{"throughput_bps", 12.34e9, "12.3 Gbps"},
		{"delivered_pps", 412_000, "412 kpps"},
		{"latency_p99_us", 1500, "1.50 ms"},
		{"loss_frac", 0.253, "25.3%"},
		{"x_count", 3200, "3.20k"},
		{"x_count", 0, "0"},
		{"x_count", math.NaN(), "n/a"},
	} {
		if got := Value(c.metric, c.v); got != c.want {
			t.Errorf("Value(%s, %v) = %q, want %q", c.metric, c.v, got, c.want)
		}
	}
}
