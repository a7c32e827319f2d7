package suite

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/peregrine-net/peregrine/internal/results"
)

// Target is one figure a suite scores: the ratio of a metric between two configs of one step
// (Num over Den at X), or of one config with itself at two points (Num at X over Num at DenX).
// Without a Bound the figure is reported, not judged.
type Target struct {
	Name    string
	Step    string // the step's title
	Metric  string
	X       map[string]float64 // the point's coordinates that matter (others are ignored)
	Num     string
	Den     string             // config; empty with DenX
	DenX    map[string]float64 // the denominator's point, same config as Num
	AtLeast bool               // met when the ratio is >= Bound (else <= Bound)
	Bound   float64            // 0: no target, reported only
}

// Score is a target's figure from a suite's runs.
type Score struct {
	Name   string  `json:"name"`
	Metric string  `json:"metric"`
	Of     string  `json:"of"` // "num ÷ den" in words
	Median float64 `json:"median,omitempty"`
	Min    float64 `json:"min,omitempty"`
	Max    float64 `json:"max,omitempty"`
	Target string  `json:"target,omitempty"` // ">= 1.25", "<= 0.80"; empty: reported only
	Met    *bool   `json:"met,omitempty"`    // nil: no target or no figure
	Reason string  `json:"reason,omitempty"` // why there is no figure
}

// Targets returns a suite's targets (none for the papers' suites).
func Targets(name string) []Target {
	if s, ok := suites[name]; ok && s.targets != nil {
		return s.targets()
	}
	return nil
}

// TargetSuites lists the suites that have targets.
func TargetSuites() []string {
	var out []string
	for _, n := range Names() {
		if suites[n].targets != nil {
			out = append(out, n)
		}
	}
	return out
}

// Scorecard scores every target against runs (a suite's, found by their first note: the step's
// title). A target whose step did not run, or whose configs have no figure, gets a Reason.
func Scorecard(targets []Target, runs []*results.Run) []Score {
	byStep := map[string]*results.Run{}
	for _, r := range runs {
		if len(r.Notes) > 0 {
			byStep[r.Notes[0]] = r
		}
	}
	var out []Score
	for _, t := range targets {
		s := Score{Name: t.Name, Metric: t.Metric}
		switch {
		case t.DenX != nil:
			s.Of = fmt.Sprintf("%s at %s ÷ at %s", t.Num, xWords(t.X), xWords(t.DenX))
		case t.X != nil:
			s.Of = fmt.Sprintf("%s ÷ %s at %s", t.Num, t.Den, xWords(t.X))
		default:
			s.Of = t.Num + " ÷ " + t.Den
		}
		if t.Bound > 0 {
			op := "<="
			if t.AtLeast {
				op = ">="
			}
			s.Target = fmt.Sprintf("%s %.2f", op, t.Bound)
		}
		run := byStep[t.Step]
		if run == nil {
			s.Reason = "step not run: " + t.Step
			out = append(out, s)
			continue
		}
		r, err := ratio(run, t)
		if err != nil {
			s.Reason = err.Error()
			out = append(out, s)
			continue
		}
		s.Median, s.Min, s.Max = r.Median, r.Min, r.Max
		if t.Bound > 0 {
			met := r.Median <= t.Bound
			if t.AtLeast {
				met = r.Median >= t.Bound
			}
			s.Met = &met
		}
		out = append(out, s)
	}
	return out
}

// ratio is a target's ratio in one run.
func ratio(run *results.Run, t Target) (results.Ratio, error) {
	if t.DenX == nil {
		rs, err := results.ComputeRatios(run, t.Metric, t.Den)
		if err != nil {
			return results.Ratio{}, err
		}
		for _, r := range rs {
			if r.Numerator == t.Num && xMatches(r.X, t.X) {
				return r, nil
			}
		}
		return results.Ratio{}, fmt.Errorf("no %s for %s and %s at %s in the run", t.Metric, t.Num, t.Den, xWords(t.X))
	}
	num, den := point(run, t.Num, t.X), point(run, t.Num, t.DenX)
	if num == nil || den == nil {
		return results.Ratio{}, fmt.Errorf("%s has no point at %s and at %s", t.Num, xWords(t.X), xWords(t.DenX))
	}
	nv, dv := repValues(num, t.Metric), repValues(den, t.Metric)
	if len(nv) == 0 || len(dv) == 0 || results.StatOf(dv).Median == 0 {
		return results.Ratio{}, fmt.Errorf("no %s for %s at both points", t.Metric, t.Num)
	}
	ns, ds := results.StatOf(nv), results.StatOf(dv)
	r := results.Ratio{Metric: t.Metric, Numerator: t.Num, Denominator: t.Num, X: t.X,
		Median: ns.Median / ds.Median, Spread: results.SpreadBounds, N: min(ns.N, ds.N)}
	if ds.Max > 0 && ds.Min > 0 {
		r.Min, r.Max = ns.Min/ds.Max, ns.Max/ds.Min // the widest the ratio could be
	}
	return r, nil
}

func point(run *results.Run, config string, x map[string]float64) *results.Point {
	for i := range run.Points {
		if p := &run.Points[i]; p.Config == config && xMatches(p.X, x) {
			return p
		}
	}
	return nil
}

func repValues(p *results.Point, metric string) []float64 {
	var vs []float64
	for _, r := range p.MeasuredReps() {
		if v, ok := r.Value(metric); ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
			vs = append(vs, v)
		}
	}
	return vs
}

// xMatches: every coordinate of want is at that value in x.
func xMatches(x, want map[string]float64) bool {
	for k, v := range want {
		if x[k] != v {
			return false
		}
	}
	return true
}

func xWords(x map[string]float64) string {
	if len(x) == 0 {
		return "every point"
	}
	var parts []string
	for _, k := range []string{"flows", "size"} {
		if v, ok := x[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %g", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

// WriteScorecard prints scores as a table for people.
func WriteScorecard(w io.Writer, scores []Score) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tRATIO\tRANGE\tWANT\tMET\tOF")
	met, judged := 0, 0
	for _, s := range scores {
		ratio, rng, verdict := "-", "-", "-"
		if s.Reason == "" {
			ratio = fmt.Sprintf("%.2f×", s.Median)
			if s.Min > 0 || s.Max > 0 {
				rng = fmt.Sprintf("%.2f–%.2f", s.Min, s.Max)
			}
		}
		if s.Met != nil {
			judged++
			verdict = "no"
			if *s.Met {
				verdict, met = "yes", met+1
			}
		}
		of := s.Of
		if s.Reason != "" {
			of += " (" + s.Reason + ")"
		}
		want := s.Target
		if want == "" {
			want = "(reported)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, ratio, rng, want, verdict, of)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d of %d targets met (medians of interleaved repetitions, one run; RANGE: per-pair extremes)\n", met, judged)
	return err
}

// SaveScorecard writes scores as JSON to path.
func SaveScorecard(path string, scores []Score) error {
	var b bytes.Buffer
	if err := EncodeScorecard(&b, scores); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// EncodeScorecard writes scores as indented JSON, ">=" as it reads.
func EncodeScorecard(w io.Writer, scores []Score) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(scores)
}
