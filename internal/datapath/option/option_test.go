package option

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type sample struct {
	Threshold int           `opt:"threshold" default:"80" range:"0..100" help:"a percentage"`
	Static    bool          `opt:"static" help:"a switch"`
	Interval  time.Duration `opt:"interval" default:"20ms" range:"1ms..10s" help:"a period"`
	Split     string        `opt:"split_at" default:"full-path" enum:"full-path,device" alias:"full=full-path" help:"an enum"`
	CPUs      []int         `opt:"split_cpus" help:"a CPU list"`
	Rules     []string      `opt:"rules" flag:"rule" help:"a list"`
	PPS       uint64        `opt:"pps" kind:"rate" default:"10k" help:"a rate"`
	Ratio     float64       `opt:"ratio" range:"0..1" help:"a fraction"`
	Derived   int           // not an option
}

func (s *sample) Validate() error {
	if s.Static && len(s.CPUs) > 0 {
		return errors.New("static and split_cpus exclude each other")
	}
	return nil
}

var schema = Declare("demo", sample{})

func TestDefaultsAndValues(t *testing.T) {
	p, err := schema.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.(*sample)
	if c.Threshold != 80 || c.Interval != 20*time.Millisecond || c.Split != "full-path" || c.PPS != 10000 || c.Static {
		t.Fatalf("defaults: %+v", c)
	}
	p, err = schema.Parse(map[string]string{"threshold": "85", "split-at": "full", "split_cpus": "0-2,5", "rules": "dport=1; sport=2", "pps": "1.5M", "static": "off"})
	if err != nil {
		t.Fatal(err)
	}
	c = p.(*sample)
	if c.Threshold != 85 || c.Split != "full-path" || len(c.CPUs) != 4 || len(c.Rules) != 2 || c.PPS != 1500000 {
		t.Fatalf("parsed: %+v", c)
	}
	v := schema.Values(c)
	if v["split_cpus"] != "0-2,5" || v["interval"] != "20ms" || v["rules"] != "dport=1;sport=2" {
		t.Errorf("values %v", v)
	}
	// What Values writes, Parse reads back to the same config.
	back, err := schema.Parse(v)
	if err != nil || back.(*sample).Threshold != 85 || len(back.(*sample).CPUs) != 4 {
		t.Errorf("round trip: %+v %v", back, err)
	}
}

func TestRefusals(t *testing.T) {
	for want, values := range map[string]map[string]string{
		"does not take option(s) bogus (it takes: threshold,":                  {"bogus": "1"},
		`option threshold (--threshold) "101": want a whole number in 0..100`:  {"threshold": "101"},
		`option threshold (--threshold) "x"`:                                   {"threshold": "x"},
		`option interval (--interval) "0s": want a duration in 1ms..10s`:       {"interval": "0s"},
		`option split_at (--split-at) "middle": want one of full-path, device`: {"split_at": "middle"},
		`option split_cpus (--split-cpus) "3-1"`:                               {"split_cpus": "3-1"},
		`option static (--static) "maybe"`:                                     {"static": "maybe"},
		`option pps (--pps) "-5"`:                                              {"pps": "-5"},
		`option ratio (--ratio) "NaN"`:                                         {"ratio": "NaN"},
		"static and split_cpus exclude each other":                             {"static": "true", "split_cpus": "1"},
	} {
		if _, err := schema.Parse(values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want an error containing %q", values, err, want)
		}
	}
}

func TestFlags(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	given := schema.Bind(fs)
	if err := fs.Parse([]string{"--threshold", "90", "--static", "--rule", "dport=1", "--rule", "dport=2"}); err != nil {
		t.Fatal(err)
	}
	got := given()
	if got["threshold"] != "90" || got["static"] != "true" || got["rules"] != "dport=1;dport=2" || len(got) != 3 {
		t.Fatalf("given %v", got)
	}
	fs = pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	schema.Bind(fs)
	if err := fs.Parse([]string{"--threshold", "900"}); err == nil || !strings.Contains(err.Error(), "want a whole number in 0..100") {
		t.Errorf("--threshold 900: %v", err)
	}
}

func TestFromAny(t *testing.T) {
	got, err := FromAny(map[string]any{"threshold": 85, "static": true, "rules": []any{"dport=1", "dport=2"}, "ratio": 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if got["threshold"] != "85" || got["static"] != "true" || got["rules"] != "dport=1;dport=2" || got["ratio"] != "0.5" {
		t.Errorf("FromAny: %v", got)
	}
	if _, err := FromAny(map[string]any{"nested": map[string]any{"a": 1}}); err == nil || !strings.Contains(err.Error(), "nested") {
		t.Errorf("nested map: %v", err)
	}
	if _, err := schema.Parse(got); err != nil {
		t.Errorf("config-file values do not parse: %v", err)
	}
}

func TestBadDeclarationsPanic(t *testing.T) {
	for name, cfg := range map[string]any{
		"no help": struct {
			A int `opt:"a"`
		}{},
		"bad default": struct {
			A int `opt:"a" default:"x" help:"h"`
		}{},
		"dash key": struct {
			A int `opt:"a-b" help:"h"`
		}{},
		"twice": struct {
			A, B int `opt:"a" help:"h"`
		}{},
		"bad type": struct {
			A map[string]int `opt:"a" help:"h"`
		}{},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Declare accepted it", name)
				}
			}()
			Declare("bad", cfg)
		}()
	}
}

func TestMarkdown(t *testing.T) {
	md := schema.Markdown()
	for _, want := range []string{"| `threshold` | `--threshold` | int 0..100 | `80` | a percentage |", "| `rules` | `--rule` | list |", "full-path \\| device"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
