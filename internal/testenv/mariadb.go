package testenv

import (
	"context"
	"database/sql"
	"testing"
)

// MariaDBDSNDefault is the machine's MariaDB, overridden by TEST_MYSQL_DSN.
const MariaDBDSNDefault = "root@tcp(127.0.0.1:3306)/test?parseTime=true"

// MariaDB opens the machine's MariaDB and names a table of the test's own (prefix and
// a unique suffix). The test's end drops it, with the tables made beside it
// (<name>_dead, <name>_migrations), and closes the pool. The caller links a MySQL
// driver (outboxmysql does).
func MariaDB(t testing.TB, prefix string) (*sql.DB, string) {
	t.Helper()
	dsn := ServiceURL(t, "TEST_MYSQL_DSN", MariaDBDSNDefault, "127.0.0.1:3306", "MariaDB")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := UniqueName(prefix)
	t.Cleanup(func() {
		for _, tbl := range []string{name, name + "_dead", name + "_migrations"} {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+tbl+"`")
		}
		_ = db.Close()
	})
	return db, name
}
