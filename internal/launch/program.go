package launch

import (
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"syscall"
)

// Exit codes a shell returns for a program it cannot run; Run's callers return them too, because mpirun's
// own codes for these cases (131, 132, 134) read as deaths by signal.
const (
	ExitNotExecutable = 126
	ExitNotFound      = 127
)

// ProgramError says that the program to launch cannot be run on this machine. Code is what a shell would
// exit with: ExitNotFound or ExitNotExecutable.
type ProgramError struct {
	Program string
	Code    int
	Err     error
}

func (e *ProgramError) Error() string {
	what := "not found"
	if e.Code == ExitNotExecutable {
		what = "not executable"
	}
	return fmt.Sprintf("launch: program %q %s: %v", e.Program, what, e.Err)
}

func (e *ProgramError) Unwrap() error { return e.Err }

// CheckProgram verifies, as a shell does before running a command, that program can be executed here: a
// path must name an executable file, a bare name must be found on PATH. It returns a *ProgramError.
func CheckProgram(program string) error {
	_, err := exec.LookPath(program)
	if err == nil {
		return nil
	}
	code := ExitNotFound
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EISDIR) {
		code = ExitNotExecutable
	}
	return &ProgramError{Program: program, Code: code, Err: err}
}
