// Package command is the examples' main-program skeleton: parse the command line, run the job, and turn
// the outcome into the exit code, so that every example's command line behaves alike and its tests can
// drive it in-process.
package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// Exit codes of Run.
const (
	OK    = 0
	Error = 1 // the job failed (missing data, a collective error, divergence, …)
	Usage = 2 // a bad command line, as the flag package does
)

// Printed marks an error the job already printed: Run does not print it again.
type Printed struct{ Err error }

func (e Printed) Error() string { return e.Err.Error() }

func (e Printed) Unwrap() error { return e.Err }

// Run parses args with parse (which prints what is wrong with them to stderr), runs job with the result,
// and returns the exit code: OK, also for -h; Usage for a bad command line; Error when the job fails, its
// error printed to stderr after the program's name unless it is Printed.
func Run[Config any](name string, args []string, stderr io.Writer, parse func([]string, io.Writer) (Config, error),
	job func(Config) error) int {
	cfg, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return OK
	}
	if err != nil {
		return Usage
	}
	if err := job(cfg); err != nil {
		if !errors.As(err, new(Printed)) {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
		}
		return Error
	}
	return OK
}
