package command

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRun(t *testing.T) {
	parse := func(args []string, stderr io.Writer) (string, error) {
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		fs.SetOutput(stderr)
		mode := fs.String("mode", "ok", "what the job does")
		return *mode, fs.Parse(args)
	}
	job := func(mode string) error {
		switch mode {
		case "fail":
			return errors.New("no data")
		case "printed":
			return Printed{errors.New("said already")}
		}
		return nil
	}
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{nil, OK, ""},
		{[]string{"-h"}, OK, "-mode"},
		{[]string{"-nope"}, Usage, "flag provided but not defined: -nope"},
		{[]string{"-mode", "fail"}, Error, "demo: no data\n"},
		{[]string{"-mode", "printed"}, Error, ""},
	} {
		var stderr bytes.Buffer
		assert.Equal(t, tc.code, Run("demo", tc.args, &stderr, parse, job), "%v", tc.args)
		if tc.stderr == "" {
			assert.Empty(t, stderr.String(), "%v", tc.args)
		} else {
			assert.Contains(t, stderr.String(), tc.stderr, "%v", tc.args)
		}
	}
}
