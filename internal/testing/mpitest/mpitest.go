// Package mpitest runs parts of a Go test as the ranks of a real MPI job. It is the helper-process pattern
// (as in os/exec's own tests) across mpirun: the test re-executes its own test binary under `mpirun -np N`
// with -test.run selecting itself and an environment variable that marks the copies as ranks. Each rank
// does its work and reports a JSON value or an error into a file; the parent test reads the reports and
// mpirun's exit code, output and run time.
//
//	func TestAllReduce(t *testing.T) {
//		if mpitest.IsRank() {
//			mpitest.Do(t, func() (any, error) {
//				topo, err := backends.DetectTopology() // mpirun's OMPI_COMM_WORLD_* variables
//				if err != nil {
//					return nil, err
//				}
//				comm, err := backends.Open("mpi", topo)
//				if err != nil {
//					return nil, err
//				}
//				buf := []float64{float64(topo.Rank)}
//				if err := comm.AllReduceSum(buf); err != nil {
//					return nil, err
//				}
//				return buf[0], comm.Close()
//			})
//			return
//		}
//		for _, r := range mpitest.Run(t, 2, t.Name()) {
//			var sum float64
//			require.NoError(t, r.Decode(&sum))
//		}
//	}
//
// The ranks need the "mpi" engine, which only binaries built with `-tags mpi` contain. When the running test
// binary lacks it, the package builds the current package's test binary with `go test -c -tags mpi` once
// per process and launches that instead, so the same test works with and without the tag. The package under
// test must import github.com/goaccel/goaccel/backends/mpi (a blank import is enough).
//
// Without mpirun the tests are skipped, except when CI=true: there a missing MPI fails the test, so a CI
// image without Open MPI cannot pass by skipping everything that needs it.
package mpitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/launch"
)

const (
	// EnvTest marks a process as a rank and names the test it runs.
	EnvTest = "GOACCEL_MPITEST_RUN"
	// EnvDir is the directory ranks write their reports to.
	EnvDir = "GOACCEL_MPITEST_DIR"
)

// DefaultTimeout bounds a whole mpirun unless WithTimeout says otherwise (or the test's own deadline is
// sooner): a hung job fails the test instead of hanging it.
const DefaultTimeout = 2 * time.Minute

// MissingMPIMessage explains what to install when mpirun is missing.
const MissingMPIMessage = "mpirun not found: these tests need Open MPI " +
	"(apt-get install openmpi-bin libopenmpi-dev) or MPICH"

// IsRank reports whether this process is one of the ranks started by Run or Launch.
func IsRank() bool { return os.Getenv(EnvTest) != "" }

// Result is what one rank reported.
type Result struct {
	Rank  int             `json:"rank"`
	Size  int             `json:"size"`
	Err   string          `json:"error,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`
}

// Decode unmarshals the rank's value into v.
func (r Result) Decode(v any) error {
	if len(r.Value) == 0 {
		return fmt.Errorf("mpitest: rank %d reported no value", r.Rank)
	}
	if err := json.Unmarshal(r.Value, v); err != nil {
		return fmt.Errorf("mpitest: rank %d's value: %w", r.Rank, err)
	}
	return nil
}

// Report records this rank's outcome for the parent test: value must be JSON-encodable (or nil). A rank
// reports once; a later report replaces an earlier one.
func Report(value any, err error) error {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return errors.New("mpitest: Report called outside a rank (" + EnvDir + " is not set)")
	}
	topo, terr := backends.DetectTopology()
	if terr != nil {
		return fmt.Errorf("mpitest: %w", terr)
	}
	res := Result{Rank: topo.Rank, Size: topo.WorldSize}
	if err != nil {
		res.Err = err.Error()
	}
	if value != nil {
		raw, jerr := json.Marshal(value)
		if jerr != nil {
			return fmt.Errorf("mpitest: rank %d's value: %w", topo.Rank, jerr)
		}
		res.Value = raw
	}
	data, jerr := json.Marshal(res)
	if jerr != nil {
		return fmt.Errorf("mpitest: %w", jerr)
	}
	// Write and rename, so that the parent never reads half a report from a rank that was killed.
	path := filepath.Join(dir, fmt.Sprintf("rank-%d.json", topo.Rank))
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return fmt.Errorf("mpitest: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

// Do runs fn as this rank's work and reports its value or error (a panic becomes an error). A failing fn
// also fails the rank's test, so that mpirun sees a non-zero exit and ends ranks that may be stuck waiting
// for this one.
func Do(t testing.TB, fn func() (any, error)) {
	t.Helper()
	value, err := func() (value any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return fn()
	}()
	if rerr := Report(value, err); rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Error(err)
	}
}

// Option configures Launch and Run.
type Option func(*config)

type config struct {
	env        []string
	timeout    time.Duration
	mpirunArgs []string
	launcher   Launcher
}

// Launcher makes the command that starts a job of np ranks of binary with args: env is the environment
// the ranks need (the whole environment of the launching process), stdout and stderr take the job's
// output. The default runs mpirun on this host (launch.Command, with WithMPIRunArgs's arguments).
type Launcher func(ctx context.Context, np int, binary string, args, env []string, stdout, stderr io.Writer) (*exec.Cmd, error)

// WithLauncher starts the job with launcher instead of mpirun on this host: for jobs across the hosts of
// an emulated cluster (internal/netcluster), whose mpirun runs on another host and must forward to the
// ranks the variables that mark them (EnvTest, EnvDir) and any given with WithEnv.
func WithLauncher(launcher Launcher) Option { return func(c *config) { c.launcher = launcher } }

// WithEnv adds NAME=value pairs to the ranks' environment.
func WithEnv(kv ...string) Option { return func(c *config) { c.env = append(c.env, kv...) } }

// WithTimeout bounds the whole mpirun run (DefaultTimeout by default).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithMPIRunArgs passes extra arguments to mpirun.
func WithMPIRunArgs(args ...string) Option {
	return func(c *config) { c.mpirunArgs = append(c.mpirunArgs, args...) }
}

// Outcome is what happened to one mpirun: its exit code and output, how long it ran, whether it was killed
// for running past the timeout, and the reports of the ranks that got to write one.
type Outcome struct {
	Argv     []string
	ExitCode int
	Stdout   string
	Stderr   string
	Elapsed  time.Duration
	TimedOut bool
	// Results holds the reports found, ordered by rank; ranks that were ended before reporting are missing.
	Results []Result
}

// Result returns rank's report, if it wrote one.
func (o *Outcome) Result(rank int) (Result, bool) {
	for _, r := range o.Results {
		if r.Rank == rank {
			return r, true
		}
	}
	return Result{}, false
}

// String summarises the outcome for test failure messages: argv, exit code, time and the end of both
// output streams.
func (o *Outcome) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\nexit code %d after %s", launch.String(o.Argv), o.ExitCode, o.Elapsed.Round(time.Millisecond))
	if o.TimedOut {
		b.WriteString(" (killed: timeout)")
	}
	fmt.Fprintf(&b, "\n--- stdout (end) ---\n%s\n--- stderr (end) ---\n%s", tail(o.Stdout), tail(o.Stderr))
	return b.String()
}

func tail(s string) string {
	const keep = 6000
	if len(s) > keep {
		return "…" + s[len(s)-keep:]
	}
	return s
}

// RequireMPIRun returns the path of mpirun. Without one it skips the test, or fails it when CI=true. Under
// -short (make test-fast) it skips: real mpirun jobs are the slow tier, which make test runs.
func RequireMPIRun(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("a real mpirun job: the slow tier (make test-slow)")
	}
	path, err := exec.LookPath("mpirun")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(MissingMPIMessage + " (CI=true: MPI is required here)")
		}
		t.Skip(MissingMPIMessage)
	}
	return path
}

// Launch runs the test testName (a t.Name(), subtests included) as np ranks under mpirun and returns what
// happened without judging it: use it for jobs that are expected to fail. It fails t only when the job
// cannot be started at all.
func Launch(t testing.TB, np int, testName string, opts ...Option) *Outcome {
	t.Helper()
	RequireMPIRun(t)
	cfg := config{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&cfg)
	}
	if deadline, ok := deadlineOf(t); ok {
		// Leave the test binary time to report our failure before its own timeout panics.
		if left := time.Until(deadline) - 10*time.Second; left < cfg.timeout {
			cfg.timeout = max(left, time.Second)
		}
	}
	binary := testBinary(t)
	dir := t.TempDir()
	args := []string{"-test.run=" + runPattern(testName), "-test.count=1", "-test.v"}
	if cfg.timeout > 10*time.Second {
		// A rank that hangs panics with every goroutine's stack shortly before mpirun is killed.
		args = append(args, "-test.timeout="+(cfg.timeout-5*time.Second).String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	env := append(os.Environ(), EnvTest+"="+testName, EnvDir+"="+dir)
	env = append(env, cfg.env...)
	var stdout, stderr bytes.Buffer
	launcher := cfg.launcher
	if launcher == nil {
		launcher = func(ctx context.Context, np int, binary string, args, env []string, stdout, stderr io.Writer) (*exec.Cmd, error) {
			return launch.Command(ctx, np, binary, args, launch.WithMPIRunArgs(cfg.mpirunArgs...),
				launch.WithEnviron(env), launch.WithStdio(nil, stdout, stderr))
		}
	}
	cmd, err := launcher(ctx, np, binary, args, env, &stdout, &stderr)
	if err != nil {
		t.Fatalf("mpitest: %v", err)
	}
	out := &Outcome{Argv: cmd.Args}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("mpitest: starting %s: %v", launch.String(cmd.Args), err)
	}
	err = cmd.Wait()
	out.Elapsed = time.Since(start)
	out.TimedOut = ctx.Err() != nil
	out.ExitCode = launch.ExitCode(err)
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	if err != nil && !errors.As(err, new(*exec.ExitError)) {
		// exec.ErrWaitDelay: mpirun exited but something it started kept the output open.
		out.Stderr += fmt.Sprintf("\n[mpitest: %v]", err)
	}
	out.Results, err = readResults(dir)
	if err != nil {
		t.Fatalf("mpitest: %v\n%s", err, out)
	}
	return out
}

// Run runs the test testName as np ranks under mpirun and returns each rank's report, indexed by rank. It
// fails t unless mpirun exits 0 within the timeout and every rank reported without error.
func Run(t testing.TB, np int, testName string, opts ...Option) []Result {
	t.Helper()
	out := Launch(t, np, testName, opts...)
	var problems []string
	if out.ExitCode != 0 || out.TimedOut {
		problems = append(problems, fmt.Sprintf("mpirun exited with code %d", out.ExitCode))
	}
	results := make([]Result, np)
	for rank := range np {
		r, ok := out.Result(rank)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("rank %d did not report", rank))
		case r.Err != "":
			problems = append(problems, fmt.Sprintf("rank %d: %s", rank, r.Err))
		case r.Size != np:
			problems = append(problems, fmt.Sprintf("rank %d saw a world of %d ranks, want %d", rank, r.Size, np))
		}
		results[rank] = r
	}
	if len(problems) > 0 {
		t.Fatalf("mpitest: %s: %s\n%s", testName, strings.Join(problems, "; "), out)
	}
	return results
}

func readResults(dir string) ([]Result, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "rank-*.json"))
	if err != nil {
		return nil, err
	}
	var results []Result
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r Result
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("report %s: %w", filepath.Base(p), err)
		}
		results = append(results, r)
	}
	slices.SortFunc(results, func(a, b Result) int { return a.Rank - b.Rank })
	return results, nil
}

// runPattern turns a test name (with subtests) into a -test.run pattern matching exactly that test.
func runPattern(testName string) string {
	parts := strings.Split(testName, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func deadlineOf(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}

var (
	buildOnce   sync.Once
	builtBinary string
	buildErr    error
	buildDir    string
)

// Binary returns a test binary of the current package that links the mpi engine, for tests that start
// their ranks with a launcher of their own (launch.Check, `accel launch`): the running one when it was
// built with -tags mpi, otherwise one built now (once per process). Its ranks run the test named by
// EnvTest in their environment.
func Binary(t testing.TB) string { return testBinary(t) }

// testBinary: see Binary.
func testBinary(t testing.TB) string {
	t.Helper()
	if backends.EngineRegistered("mpi") {
		exe, err := os.Executable()
		if err != nil {
			t.Fatalf("mpitest: locating the test binary: %v", err)
		}
		return exe
	}
	buildOnce.Do(func() { builtBinary, buildErr = buildTaggedBinary() })
	if buildErr != nil {
		t.Fatalf("mpitest: %v", buildErr)
	}
	return builtBinary
}

// buildTaggedBinary compiles the package in the working directory (go test runs tests in their package's
// directory) with -tags mpi.
func buildTaggedBinary() (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		// go test puts $GOROOT/bin first on PATH; this covers binaries run by hand.
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	buildDir, err = os.MkdirTemp("", "goaccel-mpitest-")
	if err != nil {
		return "", err
	}
	binary := filepath.Join(buildDir, "ranks.test")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "test", "-c", "-tags", "mpi", "-o", binary, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("this test binary lacks the mpi engine, and building one with "+
			"`go test -c -tags mpi` failed (is libopenmpi-dev installed?): %v\n%s", err, out)
	}
	return binary, nil
}

// Main runs the tests and then removes the test binary that Launch may have built. Call it from TestMain:
//
//	func TestMain(m *testing.M) { mpitest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
