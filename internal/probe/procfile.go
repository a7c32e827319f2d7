package probe

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
)

// readProcFile reads a whole /proc file and hands it to parse. The file is read in one go so that
// the parser sees a single consistent snapshot of the kernel's text and the tests can feed the
// same parser fixture text.
func readProcFile[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var zero T
		return zero, err
	}
	return parse(bytes.NewReader(b))
}

// cpuIDs returns the CPU id of each row, in row order.
func cpuIDs[R any](rows []R, cpu func(R) int) []int {
	ids := make([]int, len(rows))
	for i, r := range rows {
		ids[i] = cpu(r)
	}
	return ids
}

// sortByCPU sorts per-CPU rows by CPU id and refuses a CPU that appears twice: the delta
// functions pair rows by position, so a repeated CPU would pair wrong rows. file names the
// table in the error.
func sortByCPU[R any](rows []R, cpu func(R) int, file string) error {
	slices.SortFunc(rows, func(a, b R) int { return cpu(a) - cpu(b) })
	for i := 1; i < len(rows); i++ {
		if cpu(rows[i]) == cpu(rows[i-1]) {
			return fmt.Errorf("%s: cpu%d listed twice", file, cpu(rows[i]))
		}
	}
	return nil
}
