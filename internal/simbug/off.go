//go:build !simbug

// Package simbug plants known bugs in the relay, the drivers and the broker sequencer,
// for the simulator's mutation check (relay/sim_test.go, docs/testing.md): each must
// make TestSimulation fail. The bugs exist only in a build with the simbug tag; in
// every other build On is false and the compiler drops the planted code.
package simbug

// On reports whether the named planted bug is on: never, without the simbug tag.
func On(string) bool { return false }
