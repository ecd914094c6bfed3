package spec

// The committed JSON Schemas are generated from these types; a test in spec/schemagen fails when
// they are stale.
//go:generate go run ./cmd/genschema
