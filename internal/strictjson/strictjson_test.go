package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestUnknownField reads the errors of the encoding/json this binary links: an unknown member
// is recognised and named; every other decoding error is not one.
func TestUnknownField(t *testing.T) {
	type req struct {
		Timeout int `json:"timeout"`
	}
	for _, tc := range []struct {
		body string
		name string
		ok   bool
	}{
		{`{"timeot": 3}`, `"timeot"`, true},
		{`{"timeout": 3, "x y": 1}`, `"x y"`, true},
		{`{"timeout": 3}`, "", false},
		{`{"timeout": "3"}`, "", false}, // a type error
		{`{"timeout": 3`, "", false},    // a truncated body
		{`[1]`, "", false},
	} {
		dec := json.NewDecoder(strings.NewReader(tc.body))
		dec.DisallowUnknownFields()
		var v req
		err := dec.Decode(&v)
		name, ok := UnknownField(err)
		if ok != tc.ok || name != tc.name {
			t.Errorf("%s: UnknownField(%v) = %q, %v; want %q, %v", tc.body, err, name, ok, tc.name, tc.ok)
		}
	}
	if _, ok := UnknownField(nil); ok {
		t.Error("UnknownField(nil) reports an unknown field")
	}
	if _, ok := UnknownField(errors.New("unknown field")); ok {
		t.Error("an error of other words is taken for encoding/json's")
	}
}
