package main

import "github.com/outboxd/outbox/internal/safetext"

// termSafe makes a value from the database safe to print on a terminal: control
// characters (ESC, BEL, CR, C1, DEL), bidirectional overrides, line separators and
// invalid UTF-8 are shown escaped (\x1b, \u202e), so an event field can neither
// retitle the terminal nor forge a line of the table. Event fields are untrusted
// input; every output renders them through internal/safetext.
func termSafe(s string) string { return safetext.Display(s) }
