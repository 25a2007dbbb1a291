package gomlxpatch

import (
	"fmt"
	"reflect"
	"sync"
	"unsafe"

	"github.com/gomlx/gomlx/backends/simplego"
)

// simplego.Backend's opsExecutionType says how Execute schedules a graph's operations: its zero value lets
// simplego decide per execution (in parallel when one graph executes alone), the ops_sequential option sets
// the sequential value. Their numbers are read once from two real backends rather than assumed.
var (
	scheduleOnce                            sync.Once
	scheduleErr                             error
	scheduleOffset                          uintptr
	scheduleDefault, scheduleSequentialMode int64
)

func checkSchedule() error {
	scheduleOnce.Do(func() {
		field, found := reflect.TypeFor[simplego.Backend]().FieldByName("opsExecutionType")
		if !found || field.Type.Kind() != reflect.Int {
			scheduleErr = fmt.Errorf("simplego.Backend has no int field \"opsExecutionType\" (GoMLX internals " +
				"changed; written against GoMLX v0.26.0)")
			return
		}
		scheduleOffset = field.Offset
		read := func(config string) (int64, error) {
			b, err := simplego.New(config)
			if err != nil {
				return 0, err
			}
			defer b.Finalize()
			return readSchedule(b.(*simplego.Backend)), nil
		}
		if scheduleDefault, scheduleErr = read(""); scheduleErr != nil {
			return
		}
		if scheduleSequentialMode, scheduleErr = read("ops_sequential"); scheduleErr != nil {
			return
		}
		if scheduleDefault == scheduleSequentialMode {
			scheduleErr = fmt.Errorf("simplego's ops_sequential option no longer changes opsExecutionType (GoMLX " +
				"internals changed; written against GoMLX v0.26.0)")
		}
	})
	return scheduleErr
}

func schedulePointer(b *simplego.Backend) *int {
	return (*int)(unsafe.Add(unsafe.Pointer(b), scheduleOffset))
}

func readSchedule(b *simplego.Backend) int64 { return int64(*schedulePointer(b)) }

// SetSequentialOps makes b run every graph's operations one after another (sequential), or leaves the
// choice to simplego again (in parallel when one graph executes alone). It must not run while b executes
// a graph: simplego reads the setting at the start of each execution, without synchronisation.
func SetSequentialOps(b *simplego.Backend, sequential bool) error {
	if err := checkSchedule(); err != nil {
		return err
	}
	mode := scheduleDefault
	if sequential {
		mode = scheduleSequentialMode
	}
	*schedulePointer(b) = int(mode)
	return nil
}

// SequentialOps reports whether b runs graphs' operations one after another.
func SequentialOps(b *simplego.Backend) (bool, error) {
	if err := checkSchedule(); err != nil {
		return false, err
	}
	return readSchedule(b) == scheduleSequentialMode, nil
}
