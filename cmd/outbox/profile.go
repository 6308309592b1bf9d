package main

import (
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
)

// startProfiles starts the profiles the environment asks for, debugging aids for
// finding where the relay's time goes (docs/benchmarks.md), and returns what writes
// them out at exit:
//
//	OUTBOX_CPUPROFILE=FILE    a CPU profile of the run
//	OUTBOX_BLOCKPROFILE=FILE  where goroutines waited on channels, selects and locks
//	OUTBOX_MUTEXPROFILE=FILE  where goroutines waited for a mutex another one held
//	OUTBOX_ALLOCPROFILE=FILE  where the run allocated (go tool pprof -sample_index=alloc_space)
//	OUTBOX_TRACE=FILE         an execution trace (go tool trace FILE)
//
// A file that cannot be created is skipped: profiling never stops the program.
func startProfiles() (stop func()) {
	var stops []func()
	if f := create("OUTBOX_CPUPROFILE"); f != nil {
		if pprof.StartCPUProfile(f) == nil {
			stops = append(stops, func() { pprof.StopCPUProfile(); _ = f.Close() })
		}
	}
	if f := create("OUTBOX_TRACE"); f != nil {
		if trace.Start(f) == nil {
			stops = append(stops, func() { trace.Stop(); _ = f.Close() })
		}
	}
	for _, p := range []struct {
		env, name string
		on, off   func()
	}{
		{"OUTBOX_BLOCKPROFILE", "block", func() { runtime.SetBlockProfileRate(1) }, func() { runtime.SetBlockProfileRate(0) }},
		{"OUTBOX_MUTEXPROFILE", "mutex", func() { runtime.SetMutexProfileFraction(1) }, func() { runtime.SetMutexProfileFraction(0) }},
		// The default sampling (one sample per 512 KiB) already shows where a drain allocates.
		{"OUTBOX_ALLOCPROFILE", "allocs", func() {}, func() {}},
	} {
		if f := create(p.env); f != nil {
			p.on()
			stops = append(stops, func() { _ = pprof.Lookup(p.name).WriteTo(f, 0); p.off(); _ = f.Close() })
		}
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

func create(env string) *os.File {
	name := os.Getenv(env)
	if name == "" {
		return nil
	}
	f, err := os.Create(name)
	if err != nil {
		return nil
	}
	return f
}
