package userstate_test

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/userstate"
)

// best is a program's value: the best accuracy so far, as text.
type best struct{ accuracy float64 }

func (b *best) MarshalBinary() ([]byte, error) {
	return strconv.AppendFloat(nil, b.accuracy, 'g', -1, 64), nil
}

func (b *best) UnmarshalBinary(data []byte) error {
	v, err := strconv.ParseFloat(string(data), 64)
	if err != nil {
		return fmt.Errorf("best accuracy: %w", err)
	}
	b.accuracy = v
	return nil
}

// A registry saves the program's values (Collect) and restores them all or none (Plan, then Apply).
func ExampleRegistry() {
	var saving userstate.Registry
	_ = saving.Register("best", &best{accuracy: 0.91})
	saved, err := saving.Collect(backends.NewSingle())
	if err != nil {
		fmt.Println(err)
		return
	}

	var resumed userstate.Registry
	b := &best{}
	_ = resumed.Register("best", b)
	fmt.Println(resumed.Names())
	restore, err := resumed.Plan(saved, 0, 1) // checks the bytes on a fresh *best, changes nothing
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("before Apply:", b.accuracy)
	if err := restore.Apply(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("after Apply:", b.accuracy)

	// Bytes the value refuses are found by Plan, before anything changes.
	saved.Values[0].Data[0] = []byte("ninety")
	_, err = resumed.Plan(saved, 0, 1)
	fmt.Println(err)
	// Output:
	// [best]
	// before Apply: 0
	// after Apply: 0.91
	// userstate: value "best" refuses the checkpoint's bytes: best accuracy: strconv.ParseFloat: parsing "ninety": invalid syntax
}

// A per-process value is saved for every process and each gets its own back.
func ExamplePerRank() {
	comms, _ := backends.NewInProcessGroup(2)
	var saved userstate.Saved
	var wg sync.WaitGroup
	for _, comm := range comms {
		wg.Go(func() {
			var reg userstate.Registry
			_ = reg.Register("shard-best", &best{accuracy: 0.5 + 0.1*float64(comm.Rank())}, userstate.PerRank())
			s, err := reg.Collect(comm) // collective: every process calls it
			if err != nil {
				fmt.Println(err)
			}
			if comm.Rank() == 0 {
				saved = s // the main process has every rank's bytes
			}
		})
	}
	wg.Wait()
	for rank := range 2 {
		var reg userstate.Registry
		b := &best{}
		_ = reg.Register("shard-best", b, userstate.PerRank())
		restore, err := reg.Plan(saved, rank, 2)
		if err == nil {
			err = restore.Apply()
		}
		fmt.Println("rank", rank, b.accuracy, err)
	}
	_, err := new(userstate.Registry).Plan(saved, 0, 2)
	fmt.Println(err)
	// Output:
	// rank 0 0.5 <nil>
	// rank 1 0.6 <nil>
	// userstate: the checkpoint holds "shard-best", which this run did not register: register every value the saving run registered (RegisterForCheckpointing) before loading
}

// Resize says how per-process values move to another number of processes: here the best of all saved
// processes goes to every new one.
func ExampleResize() {
	saved := userstate.Saved{Values: []userstate.SavedValue{{Name: "shard-best", PerRank: true,
		Data: [][]byte{[]byte("0.5"), []byte("0.7")}}}}
	bestOfAll := userstate.Resize(func(saved [][]byte, rank, worldSize int) ([]byte, error) {
		top := &best{}
		for _, data := range saved {
			var b best
			if err := b.UnmarshalBinary(data); err != nil {
				return nil, err
			}
			top.accuracy = max(top.accuracy, b.accuracy)
		}
		return top.MarshalBinary()
	})
	var reg userstate.Registry
	b := &best{}
	_ = reg.Register("shard-best", b, userstate.PerRank(), bestOfAll)
	restore, err := reg.Plan(saved, 2, 4) // rank 2 of 4, from a checkpoint of 2 processes
	if err == nil {
		err = restore.Apply()
	}
	fmt.Println(b.accuracy, err)
	// Output: 0.7 <nil>
}

// Undo sets the values Apply set back to what they were: LoadState uses it when another process could
// not apply its values.
func ExampleRestore_Undo() {
	var reg userstate.Registry
	b := &best{accuracy: 0.1}
	_ = reg.Register("best", b)
	restore, _ := reg.Plan(userstate.Saved{Values: []userstate.SavedValue{{Name: "best", Data: [][]byte{[]byte("0.8")}}}}, 0, 1)
	_ = restore.Apply()
	fmt.Println(b.accuracy)
	_ = restore.Undo()
	fmt.Println(b.accuracy)
	// Output:
	// 0.8
	// 0.1
}
