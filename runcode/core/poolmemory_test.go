package core

import (
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

func TestParsePoolMemory(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64 // -1: refused
	}{
		{"0", 0},
		{"256Mi", 256 << 20},
		{"1Gi", 1 << 30},
		{"1G", 1e9},
		{"500k", 500e3},
		{"1048576", 1 << 20},
		{"", -1},
		{"lots", -1},
		{"-1Mi", -1},
		{"+1Mi", -1},
		{"1.5Gi", -1},
		{"Mi", -1},
		{"1mi", -1},
		{"9999999999Ti", -1},
	} {
		got, err := ParsePoolMemory(tt.in)
		if tt.want < 0 {
			if !errors.Is(err, sbtypes.ErrInvalid) {
				t.Errorf("%q: %d, %v; want refused as invalid", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%q: %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}
