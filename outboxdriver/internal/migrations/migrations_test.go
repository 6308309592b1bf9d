package migrations

import (
	"errors"
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestApply: only missing versions run, in order, each recorded after it ran; a failed
// step stops the loop, names the migration and records nothing for it.
func TestApply(t *testing.T) {
	ms := []Migration{{1, "a", "A"}, {2, "b", "B"}, {3, "c", "C"}}
	var ran, recorded []int
	applied, err := Apply(ms, map[int]bool{1: true}, func(m Migration) error {
		ran = append(ran, m.Version)
		return nil
	}, func(v int) error {
		recorded = append(recorded, v)
		return nil
	})
	if err != nil || fmt.Sprint(applied, ran, recorded) != "[2 3] [2 3] [2 3]" {
		t.Fatalf("applied %v ran %v recorded %v err %v", applied, ran, recorded, err)
	}
	recorded = nil
	_, err = Apply(ms, nil, func(m Migration) error {
		if m.Version == 2 {
			return errors.New("boom")
		}
		return nil
	}, func(v int) error { recorded = append(recorded, v); return nil })
	if err == nil || err.Error() != "migration 002_b: boom" || fmt.Sprint(recorded) != "[1]" {
		t.Fatalf("failed step: %v, recorded %v", err, recorded)
	}
}

type fakeRows struct {
	vs  []int
	err error
}

func (r *fakeRows) Next() bool { return len(r.vs) > 0 }
func (r *fakeRows) Scan(dest ...any) error {
	*dest[0].(*int), r.vs = r.vs[0], r.vs[1:]
	return nil
}
func (r *fakeRows) Err() error { return r.err }

func TestVersions(t *testing.T) {
	done, err := Versions(&fakeRows{vs: []int{1, 3}})
	if err != nil || !done[1] || done[2] || !done[3] {
		t.Fatalf("%v %v", done, err)
	}
	if _, err := Versions(&fakeRows{err: errors.New("cut")}); err == nil {
		t.Fatal("a list read halfway passed")
	}
}
