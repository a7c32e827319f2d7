package probe

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// scanCPUTable reads a /proc table whose header is "CPU0 CPU1 ..." and whose rows are
// "LABEL: ...", as /proc/softirqs and /proc/interrupts are: it checks the header and hands each
// non-empty row's label and remaining fields to row, with the number of CPU columns. file names the table in errors.
func scanCPUTable(r io.Reader, file string, row func(ncpu int, label string, fields []string) error) ([]int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%s: empty", file)
	}
	var cpus []int
	for _, h := range strings.Fields(sc.Text()) {
		id, err := strconv.Atoi(strings.TrimPrefix(h, "CPU"))
		if !strings.HasPrefix(h, "CPU") || err != nil {
			return nil, fmt.Errorf("%s: bad header label %q", file, h)
		}
		cpus = append(cpus, id)
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("%s: no CPU columns", file)
	}
	if !slices.IsSorted(cpus) {
		return nil, fmt.Errorf("%s: CPU columns out of order: %v", file, cpus)
	}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		label, ok := strings.CutSuffix(f[0], ":")
		if !ok {
			return nil, fmt.Errorf("%s: bad row %q", file, sc.Text())
		}
		if err := row(len(cpus), label, f[1:]); err != nil {
			return nil, err
		}
	}
	return cpus, sc.Err()
}
