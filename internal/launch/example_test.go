package launch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goaccel/goaccel/internal/jobenv"
	"github.com/goaccel/goaccel/internal/launch"
)

// pinnedMachine fixes what Argv would otherwise detect (the MPI, root, the cores, the environment), so
// that the examples print the same everywhere.
var pinnedMachine = []launch.Option{launch.WithFlavor(launch.OpenMPI), launch.WithRunAsRoot(false), launch.WithCPUs(2),
	launch.WithoutDefaultMCA(), launch.WithEnviron([]string{"GOMLX_BACKEND=go", "HOME=/home/me"})}

// stubProgram writes an executable shell script that stands in for mpirun or ssh, so that the examples run
// anywhere; remove removes it.
func stubProgram(script string) (path string, remove func()) {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		panic(err)
	}
	path = filepath.Join(dir, "stub")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		panic(err)
	}
	return path, func() { _ = os.RemoveAll(dir) }
}

func printArgv(procs int, opts ...launch.Option) {
	argv, err := launch.Argv(procs, "./train", nil, append(pinnedMachine, opts...)...)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(launch.String(argv))
}

// Two hosts of four slots each: with 0 processes, one per slot; ranks 0-3 run on node1, 4-7 on node2.
func ExampleWithHosts() {
	printArgv(0, launch.WithHosts(launch.Host{Name: "node1", Slots: 4}, launch.Host{Name: "node2", Slots: 4}))
	printArgv(9, launch.WithHosts(launch.Host{Name: "node1", Slots: 4}, launch.Host{Name: "node2", Slots: 4}))
	// Output:
	// mpirun -np 8 --host node1:4,node2:4 --bind-to none -x GOMLX_BACKEND ./train
	// launch: 9 processes do not fit the 8 slots of hosts node1:4,node2:4: give fewer processes or more slots (HOST:SLOTS)
}

// ParseHosts reads `accel launch --hosts`: slots are 1 when left out.
func ExampleParseHosts() {
	hosts, err := launch.ParseHosts("node1:4,node2")
	fmt.Println(hosts, err)
	_, err = launch.ParseHosts("node1:4,node1:2")
	fmt.Println(err)
	// Output:
	// [node1:4 node2:1] <nil>
	// launch: host "node1" appears twice in "node1:4,node1:2": give it once, with all its slots
}

// One network for the ranks' data and for Open MPI's own control connections.
func ExampleWithNetwork() {
	printArgv(1, launch.WithNetwork("10.0.0.0/24"))
	printArgv(1, launch.WithNetwork("eth1"))
	// Output:
	// mpirun -np 1 --bind-to none --mca btl_tcp_if_include 10.0.0.0/24 --mca oob_tcp_if_include 10.0.0.0/24 -x GOMLX_BACKEND ./train
	// mpirun -np 1 --bind-to none --mca btl_tcp_if_include eth1 --mca oob_tcp_if_include eth1 -x GOMLX_BACKEND ./train
}

// ssh on another port starts the daemons on the other hosts.
func ExampleWithLaunchAgent() {
	printArgv(2, launch.WithHosts(launch.Host{Name: "a", Slots: 1}, launch.Host{Name: "b", Slots: 1}),
		launch.WithLaunchAgent("ssh -p 2222"))
	// Output: mpirun -np 2 --host a:1,b:1 --bind-to none --mca plm_rsh_agent 'ssh -p 2222' -x GOMLX_BACKEND ./train
}

// GOMLX_BACKEND is forwarded by default; HOME and a variable set for the job only are asked for.
func ExampleWithForwardEnv() {
	printArgv(1, launch.WithForwardEnv("HOME", "OMP_NUM_THREADS=1"))
	// Output: mpirun -np 1 --bind-to none -x GOMLX_BACKEND -x HOME -x OMP_NUM_THREADS ./train
}

// A launch agent that cannot reach host b fails the job before mpirun starts, naming the host. (A script
// stands in for ssh so that the example runs anywhere.)
func ExampleWithHostProbe() {
	agent, remove := stubProgram("[ \"$1\" = b ] && { echo \"ssh: Could not resolve hostname $1\" >&2; exit 255; }\nexit 0\n")
	defer remove()
	_, err := launch.Run(context.Background(), 0, "./train", nil, launch.WithMPIRun("true"), launch.WithFlavor(launch.OpenMPI),
		launch.WithHosts(launch.Host{Name: "a", Slots: 1}, launch.Host{Name: "b", Slots: 1}),
		launch.WithLaunchAgent(agent), launch.WithHostProbe(10*time.Second))
	var herr *launch.HostError
	if errors.As(err, &herr) {
		fmt.Println("host:", herr.Host)
		fmt.Println(strings.Contains(herr.Reason, "ssh: Could not resolve hostname b"))
	}
	// Output:
	// host: b
	// true
}

// WithFailureNotice receives the process whose failure ended the job. Here a stand-in for mpirun reports,
// as Open MPI does, that rank 1 on host n2 was killed.
func ExampleWithFailureNotice() {
	fakeMPIRun, remove := stubProgram("echo 'mpirun noticed that process rank 1 with PID 0 on node n2 exited on signal 9 (Killed).' >&2\nexit 137\n")
	defer remove()
	code, err := launch.Run(context.Background(), 2, "true", nil, launch.WithMPIRun(fakeMPIRun),
		launch.WithFlavor(launch.OpenMPI), launch.WithStdio(nil, os.Stdout, &bytes.Buffer{}), launch.WithHostProbe(0),
		launch.WithHosts(launch.Host{Name: "n1", Slots: 1}, launch.Host{Name: "n2", Slots: 1}),
		launch.WithFailureNotice(func(f launch.Failure) { fmt.Println(f) }))
	fmt.Println("exit code", code, err)
	// Output:
	// rank 1 on host n2 was killed by signal 9 (killed)
	// exit code 137 <nil>
}

// Inside `salloc -N 3 --ntasks-per-node=4` (or an sbatch script), the allocation's hosts and tasks.
func ExampleSlurmHosts() {
	hosts, err := launch.SlurmHosts([]string{"SLURM_JOB_ID=812", "SLURM_JOB_NODELIST=gpu[07-08],cpu3",
		"SLURM_TASKS_PER_NODE=4(x2),1"})
	fmt.Println(hosts, err)
	// Output: [gpu07:4 gpu08:4 cpu3:1] <nil>
}

func ExampleExpandNodeList() {
	names, err := launch.ExpandNodeList("node[1-3,5],gpu[09-10]")
	fmt.Println(names, err)
	// Output: [node1 node2 node3 node5 gpu09 gpu10] <nil>
}

func ExampleExpandTasksPerNode() {
	counts, err := launch.ExpandTasksPerNode("4(x2),2")
	fmt.Println(counts, err)
	// Output: [4 4 2] <nil>
}

// Check runs the check's processes with the job's options and reads rank 0's report. Here a stand-in for
// mpirun prints a report, so that the example runs anywhere; `accel launch --check` runs the real one.
func ExampleCheck() {
	report := `{"ranks":[{"rank":0,"host":"n1","goaccel_version":"0.3.0","mpi_library":"Open MPI v4.1.4"},` +
		`{"rank":1,"host":"n2","goaccel_version":"0.3.0","mpi_library":"Open MPI v4.1.4"}],"all_reduces":[` +
		`{"bytes":1048576,"seconds":0.004,"runs":5,"algorithm_bandwidth":262144000,"bus_bandwidth":262144000},` +
		`{"bytes":16777216,"seconds":0.064,"runs":3,"algorithm_bandwidth":262144000,"bus_bandwidth":262144000}]}`
	fakeMPIRun, remove := stubProgram("echo 'goaccel-check: " + report + "'\n")
	defer remove()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := launch.Check(ctx, 2, "accel", []string{"check-rank"}, launch.WithMPIRun(fakeMPIRun),
		launch.WithFlavor(launch.OpenMPI), launch.WithHostProbe(0),
		launch.WithHosts(launch.Host{Name: "n1", Slots: 1}, launch.Host{Name: "n2", Slots: 1}))
	fmt.Print(got)
	fmt.Println("error:", err)
	// Output:
	// 2 process(es) on 2 host(s):
	//   n1  rank 0      goaccel 0.3.0; Open MPI v4.1.4
	//   n2  rank 1      goaccel 0.3.0; Open MPI v4.1.4
	// float32 all-reduce across the 2 processes (median of the slowest process's times):
	//    1 MiB      4.000 ms  bus bandwidth    2.097 Gbit/s  (algorithm bandwidth 2.097 Gbit/s)
	//   16 MiB     64.000 ms  bus bandwidth    2.097 Gbit/s  (algorithm bandwidth 2.097 Gbit/s)
	//   bus bandwidth = size / time × 2(N−1)/N: what each process sent and received per second in a ring;
	//   the slowest link between hosts bounds it
	// error: <nil>
}

// HangSummary is what `accel launch` prints when asked where its job is stuck: here rank 1 was stopped
// while the others waited in all-reduce #118.
func ExampleHangSummary() {
	wait := func(rank int) jobenv.RankState {
		return jobenv.RankState{Rank: rank, Size: 4, Seq: 118, Waiting: true, WaitSeq: 118,
			WaitCall: "all-reduce of float32[2097152]", WaitBytes: 8 << 20, WaitedSeconds: 92}
	}
	states := map[int]jobenv.RankState{0: wait(0), 2: wait(2), 3: wait(3)}
	for _, line := range launch.HangSummary(4, states) {
		fmt.Println(line)
	}
	// Output:
	// ranks 0, 2, 3 wait in all-reduce #118 (float32[2097152], 8.0 MiB) for 92 s
	// rank 1 did not answer (stopped or busy in native code); has not arrived at all-reduce #118, where ranks 0, 2, 3 wait
}

// WithTimeline sets GOACCEL_TIMELINE for every process, and passes it to those on other hosts.
func ExampleWithTimeline() {
	argv, err := launch.Argv(2, "./train", nil, append(pinnedMachine, launch.WithTimeline("/tmp/job.json"))...)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(launch.String(argv))
	// Output: mpirun -np 2 --bind-to none -x GOACCEL_TIMELINE -x GOMLX_BACKEND ./train
}
