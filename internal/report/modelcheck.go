package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/format"
)

// The model against the machine: the projection (project.go) predicts a config's receive
// capacity at N cores from the per-stage costs of one run (the base); a run measured with N
// CPUs (bench --mode-cpus, scripts/device-bench.sh) says what N cores did. ModelCheck puts the
// two side by side, per config and point, with the error. A measured point that was not
// receive-bound (no CPU of its path saturated, nothing lost) measured the sender, not the
// receive capacity: its error is shown but flagged, and the summary leaves it out.

// ModelRow is one (scenario, config, point, N): predicted vs measured, packets/s.
type ModelRow struct {
	Scenario  string  `json:"scenario"`
	Config    string  `json:"config"`
	Point     string  `json:"point"`
	Placement string  `json:"placement"`
	Cores     int     `json:"cores"`     // N: the CPUs the measured run gave the receiving host
	BaseRun   string  `json:"base_run"`  // the run whose stage costs fed the model
	BaseCPUs  int     `json:"base_cpus"` // the CPUs of the base run's stage placement (its mode CPUs, else the machine's)
	Predicted float64 `json:"predicted_pps"`
	// Measured is 0 and MeasuredRun "" where no run at N measured this config and point.
	Measured     float64 `json:"measured_pps,omitempty"`
	MeasuredRun  string  `json:"measured_run,omitempty"`
	ReceiveBound bool    `json:"receive_bound"` // the measured point's bottleneck CPU was >= 90 % busy
	// Err is (predicted - measured) / measured; absent without a measurement.
	Err *float64 `json:"error,omitempty"`
}

// ModelCheck predicts every point of each base run at each N in at (matched by scenario) and
// sets the measured rate of the same config and point beside it.
func ModelCheck(bases []*results.Run, at map[int][]*results.Run) []ModelRow {
	var ns []int
	for n := range at {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	var rows []ModelRow
	for _, base := range bases {
		baseCPUs := len(base.Arrangement.StageCPUs)
		if baseCPUs == 0 {
			baseCPUs = base.Env.CPUs
		}
		for _, pp := range projPoints(base) {
			for _, n := range ns {
				row := ModelRow{Scenario: base.Scenario.Name, Config: pp.config, Point: results.XKey(pp.x),
					Placement: placementCell(pp.class), Cores: n, BaseRun: base.ID, BaseCPUs: baseCPUs,
					Predicted: projectRate(pp, n)}
				for _, run := range at[n] {
					if run.Scenario.Name != base.Scenario.Name {
						continue
					}
					for _, mp := range projPoints(run) {
						if mp.config == pp.config && results.XKey(mp.x) == row.Point {
							row.Measured, row.MeasuredRun, row.ReceiveBound = mp.measured, run.ID, mp.sat
						}
					}
				}
				if row.Measured > 0 {
					e := (row.Predicted - row.Measured) / row.Measured
					row.Err = &e
				}
				rows = append(rows, row)
			}
		}
	}
	return rows
}

// WriteModelCheck prints the rows as a table, with the median and worst |error| over the
// receive-bound measured points.
func WriteModelCheck(w io.Writer, rows []ModelRow) error {
	fmt.Fprintln(w, "MODEL vs MEASURED: the projection from the base run's per-stage ns per packet, at each CPU count, next to a run")
	fmt.Fprintln(w, "  measured with that many CPUs. ERR = (model - measured) / measured; (not bound) marks a measured point whose")
	fmt.Fprintln(w, "  bottleneck CPU was below 90 % busy: it measured the sender, not the receive capacity, and is left out of the summary.")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tCONFIG\tPOINT\tPLACEMENT\tCPUS\tMODEL\tMEASURED\tERR")
	var errs []float64
	for _, r := range rows {
		meas, errTxt := "-", "-"
		if r.Measured > 0 {
			meas = format.Value("x_pps", r.Measured)
		}
		if r.Err != nil {
			errTxt = fmt.Sprintf("%+.0f%%", 100**r.Err)
			if r.ReceiveBound {
				errs = append(errs, math.Abs(*r.Err))
			} else {
				errTxt += " (not bound)"
			}
		}
		fmt.Fprintln(tw, strings.Join([]string{r.Scenario, r.Config, r.Point, r.Placement, fmt.Sprint(r.Cores),
			format.Value("x_pps", r.Predicted), meas, errTxt}, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(errs) == 0 {
		fmt.Fprintln(w, "\nno receive-bound measured point: the model is not tested by these runs")
		return nil
	}
	slices.Sort(errs)
	fmt.Fprintf(w, "\nmodel vs measured: median |error| %.0f%%, worst %.0f%% over %d receive-bound points\n",
		100*errs[len(errs)/2], 100*errs[len(errs)-1], len(errs))
	return nil
}

// WriteModelCheckJSON writes the rows as a JSON array.
func WriteModelCheckJSON(w io.Writer, rows []ModelRow) error {
	if rows == nil {
		rows = []ModelRow{}
	}
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(rows)
}
