// Package strictjson recognises what a decoder that disallows unknown fields refuses, so that callers name the field.
package strictjson

import "strings"

// unknownPrefix starts the error encoding/json returns for a member a decoder with
// DisallowUnknownFields does not know: `json: unknown field "name"`. encoding/json (v1) gives
// that error no type and wraps no sentinel; json/v2's ErrUnknownName is only behind
// GOEXPERIMENT=jsonv2. The text is the only signal, so it is read here and nowhere else, and
// TestUnknownField fails should a Go release change it.
const unknownPrefix = "json: unknown field "

// UnknownField returns the quoted name of the unknown member err reports (`"name"`), and
// whether err is that error.
func UnknownField(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	name, ok := strings.CutPrefix(err.Error(), unknownPrefix)
	if !ok {
		return "", false
	}
	return name, true
}
