package outboxdriver

import (
	"errors"
	"testing"
)

func TestSchemaState(t *testing.T) {
	known := []int{1, 2, 3}
	for _, tc := range []struct {
		name    string
		applied map[int]bool
		want    error
		version int
	}{
		{"current", map[int]bool{1: true, 2: true, 3: true}, nil, 3},
		{"behind", map[int]bool{1: true}, ErrSchemaBehind, 1},
		{"ahead", map[int]bool{1: true, 2: true, 3: true, 4: true}, ErrSchemaAhead, 4},
		{"not managed", nil, nil, 0},
	} {
		st := NewSchemaState(known, tc.applied)
		if err := st.Check(); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: Check() = %v, want %v", tc.name, err, tc.want)
		}
		if st.Version() != tc.version || st.Latest != 3 {
			t.Errorf("%s: version %d, latest %d", tc.name, st.Version(), st.Latest)
		}
	}
}
