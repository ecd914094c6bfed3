// Package scale holds the operator's scale test on a KWOK cluster (build tag kwok).
//
// It is a package of its own, without the operator package's goroutine leak check: client-go
// keeps an HTTP/2 connection's read loop to the API server past the test's end.
package scale
