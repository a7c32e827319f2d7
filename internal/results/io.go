package results

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const schemaPrefix = "peregrine.run/v"

// Encode writes the run as indented JSON. An empty Schema is set to this package's Schema.
func (r *Run) Encode(w io.Writer) error {
	if r.Schema == "" {
		r.Schema = Schema
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		// The usual cause is a NaN or Inf metric, which JSON cannot carry; Validate names it.
		return fmt.Errorf("encode run %q: %w (Validate reports non-finite values)", r.ID, err)
	}
	return nil
}

// Write stores the run at path atomically (temporary file + rename), so an interrupted write
// never leaves half a document where a complete older one was.
func (r *Run) Write(path string) error {
	var buf bytes.Buffer
	if err := r.Encode(&buf); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write run: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("write run %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write run %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write run %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write run %s: %w", path, err)
	}
	return nil
}

// Read loads a run file, refusing files of another or newer schema.
func Read(path string) (*Run, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read run: %w", err)
	}
	r, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("read run %s: %w", path, err)
	}
	return r, nil
}

// Decode parses a run document. The schema is checked before the body is decoded, so a newer
// file fails with a version message rather than a confusing field error.
func Decode(data []byte) (*Run, error) {
	var head struct {
		Schema *string `json:"schema"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if head.Schema == nil {
		return nil, fmt.Errorf("no \"schema\" field: not a peregrine run file (want %q)", Schema)
	}
	upgrade := *head.Schema == SchemaV1
	if !upgrade {
		if err := CheckSchema(*head.Schema); err != nil {
			return nil, err
		}
	}
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode %s document: %w", *head.Schema, err)
	}
	if upgrade {
		r.Upgrade()
	}
	return &r, nil
}

// SchemaV1 is the previous format, which Decode still reads: v2 only added fields, and the
// cost metrics v1 lacks are derived from what it has (CPU shares, stages).
const SchemaV1 = "peregrine.run/v1"

// Upgrade turns a v1 run into a v2 one in memory: the schema is renamed and the cost metrics
// are derived from the CPU shares and stage attribution it recorded (a v1 file has no NET_RX
// totals, sender CPU time or program statistics, so those metrics stay absent), then summaries
// are recomputed so they cover the new metrics.
func (r *Run) Upgrade() {
	if r.Schema != SchemaV1 {
		return
	}
	r.Schema = Schema
	r.ComputeCosts()
	r.SummarizeAll()
	r.Notes = append(r.Notes, "read from a "+SchemaV1+" file: cost metrics derived on reading (no NET_RX totals, sender CPU or eBPF statistics in v1)")
}

// CheckSchema accepts exactly the version this build writes and explains anything else
// (Decode also reads SchemaV1, upgrading it).
func CheckSchema(s string) error {
	if s == Schema {
		return nil
	}
	if !strings.HasPrefix(s, schemaPrefix) {
		return fmt.Errorf("schema %q is not a peregrine run (want %q)", s, Schema)
	}
	have, _ := strconv.Atoi(strings.TrimPrefix(Schema, schemaPrefix))
	got, err := strconv.Atoi(strings.TrimPrefix(s, schemaPrefix))
	switch {
	case err != nil:
		return fmt.Errorf("schema %q has no valid version number (want %q)", s, Schema)
	case got > have:
		return fmt.Errorf("schema %q is newer than this peregrine reads (%q): upgrade peregrine to read it", s, Schema)
	default:
		return fmt.Errorf("schema %q is older than this peregrine reads (%q): re-run, or read it with the peregrine that wrote it", s, Schema)
	}
}
