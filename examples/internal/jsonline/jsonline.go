// Package jsonline writes the one-line JSON summaries the examples end with, which scripts and the
// benchmarks read: a value encoded on one line, non-finite floats as null, durations in seconds.
package jsonline

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"
)

// Write prints v as one line of JSON.
func Write(w io.Writer, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding the summary: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", line)
	return err
}

// Seconds rounds to the microsecond: more digits are noise and make the line harder to read.
func Seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1e6) / 1e6 }

// Float is a float64 that encodes NaN and ±Inf (a diverged loss) as null: encoding/json refuses them, and
// the summary line must stay valid JSON whatever training did.
type Float float64

// MarshalJSON encodes f, or null when it is not finite.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads f back, null as NaN (tests and the benchmarks read the summaries).
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.NaN())
		return nil
	}
	var v float64
	err := json.Unmarshal(b, &v)
	*f = Float(v)
	return err
}
