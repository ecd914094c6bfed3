// Package imagearg tells which source an image string names, with the standard library only: spec reads a declaration's image through it, the lean front its --image.
package imagearg

import "strings"

// Kind is the source an image string names.
type Kind int

const (
	// None is the empty string.
	None Kind = iota
	Host
	OCILayout
	Tarball
	Dir
	Ref
)

// The string forms with a fixed spelling.
const (
	HostString = "host"
	// OCILayoutPrefix and OCILayoutLongPrefix mark an OCI layout directory.
	OCILayoutPrefix     = "oci:"
	OCILayoutLongPrefix = "oci-layout:"
)

// Parse classifies s:
//
//	""                                → None
//	"host"                            → Host
//	"oci:<path>", "oci-layout:<path>" → OCILayout, value the path (may be empty)
//	"*.tar", "*.tar.gz", "*.tgz"      → Tarball
//	"./x", "../x", "/x", ".", ".."    → Dir
//	anything else                     → Ref ("python:3.12", "ghcr.io/o/i@sha256:…")
//
// value is s but for a layout, whose prefixes it drops.
func Parse(s string) (k Kind, value string) {
	switch {
	case s == "":
		return None, ""
	case s == HostString:
		return Host, s
	case strings.HasPrefix(s, OCILayoutLongPrefix), strings.HasPrefix(s, OCILayoutPrefix):
		// Both trimmed, in this order, as the TypeScript SDK does (spec/testdata/corpus).
		return OCILayout, strings.TrimPrefix(strings.TrimPrefix(s, OCILayoutLongPrefix), OCILayoutPrefix)
	case strings.HasSuffix(s, ".tar"), strings.HasSuffix(s, ".tar.gz"), strings.HasSuffix(s, ".tgz"):
		return Tarball, s
	case s == ".", s == "..", strings.HasPrefix(s, "/"), strings.HasPrefix(s, "./"), strings.HasPrefix(s, "../"):
		return Dir, s
	default:
		return Ref, s
	}
}
