package outboxdriver_test

import (
	"fmt"

	"github.com/outboxd/outbox/outboxdriver"
)

// Name the outbox table as the CLI's --table does: "name" or "schema.name", defaults
// filled and names checked before any of them reaches SQL.
func ExampleParseTable() {
	for _, s := range []string{"outbox", "billing.outbox", "billing.out;box"} {
		t, err := outboxdriver.ParseTable(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(t, t.Write, t.Partitions)
	}
	// Output:
	// public.outbox rows 64
	// billing.outbox rows 64
	// invalid identifier: table name "out;box" must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$
}
