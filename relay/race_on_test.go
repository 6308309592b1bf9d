//go:build race

package relay_test

const raceEnabled = true
