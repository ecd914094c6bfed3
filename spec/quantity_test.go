package spec

import (
	"errors"
	"strings"
	"testing"
)

func TestQuantityMilliValue(t *testing.T) {
	ok := map[Quantity]int64{
		"1": 1000, "250m": 250, "0.5": 500, "2": 2000, "1.5": 1500, "1m": 1, "1e3": 1_000_000, "-2": -2000,
		"9223372036854775m": 9223372036854775,
	}
	for q, want := range ok {
		got, err := q.MilliValue()
		if err != nil || got != want {
			t.Errorf("%q.MilliValue() = %d, %v; want %d", q, got, err, want)
		}
	}
	for _, q := range []Quantity{"", "x", "0.0005", "1500500u", "1n", "10E", "8Ei", "1 ", "Mi", "e3", "1e3.5", ".", "+"} {
		if v, err := q.MilliValue(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q.MilliValue() = %d, %v; want ErrInvalid", q, v, err)
		}
	}
}

func TestQuantityBytes(t *testing.T) {
	ok := map[Quantity]int64{
		"1": 1, "1Ki": 1024, "512Mi": 512 << 20, "1.5Mi": 1536 << 10, "1G": 1_000_000_000, "1e3": 1000,
		"4Ei": 4 << 60, "1000m": 1,
	}
	for q, want := range ok {
		got, err := q.Bytes()
		if err != nil || got != want {
			t.Errorf("%q.Bytes() = %d, %v; want %d", q, got, err, want)
		}
	}
	for _, q := range []Quantity{"", "512MB", "0.5", "1500m", "8Ei", "10E", "9223372036854775807"} {
		if v, err := q.Bytes(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q.Bytes() = %d, %v; want ErrInvalid", q, v, err)
		}
	}
}

func TestLimitsHelpers(t *testing.T) {
	var l Limits
	if m, err := l.CPUMillis(); err != nil || m != 1000 {
		t.Errorf("default CPUMillis = %d, %v", m, err)
	}
	if b, err := l.MemoryBytes(); err != nil || b != 512<<20 {
		t.Errorf("default MemoryBytes = %d, %v", b, err)
	}
	if b, err := l.DiskBytes(); err != nil || b != 1<<30 {
		t.Errorf("default DiskBytes = %d, %v", b, err)
	}
	if p := l.Processes(); p != DefaultMaxProcesses {
		t.Errorf("default Processes = %d", p)
	}
	l = Limits{CPU: "250m", Memory: "64Mi", Disk: "2Gi", MaxProcesses: i64(7)}
	m, _ := l.CPUMillis()
	mem, _ := l.MemoryBytes()
	disk, _ := l.DiskBytes()
	if m != 250 || mem != 64<<20 || disk != 2<<30 || l.Processes() != 7 {
		t.Errorf("got %d %d %d %d", m, mem, disk, l.Processes())
	}
}

// TestQuantityHugeExponentRefused guards against a stall: resource.Quantity arithmetic on
// "1e999999999" takes minutes, so such text must be refused before it is compared.
func TestQuantityHugeExponentRefused(t *testing.T) {
	for _, q := range []Quantity{"1e999999999", "1E-999999999", "1e31", "1e-31", "1e99999999999999999999", Quantity("1" + strings.Repeat("0", 64))} {
		if _, err := q.Parse(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q.Parse() = %v, want ErrInvalid", q, err)
		}
		s := Sandbox{ID: "a", Image: Image{Host: true}, Limits: Limits{CPU: q, Memory: q, Disk: q}}
		if got := summarize(s.Validate("")); len(got) != 3 || !strings.HasSuffix(got[0], RuleQuantitySyntax) {
			t.Errorf("validate %q: %v", q, got)
		}
	}
	for _, q := range []Quantity{"1e30", "5e-3", "1E", "2Ei"} {
		if _, err := q.Parse(); err != nil {
			t.Errorf("%q.Parse() = %v", q, err)
		}
	}
}
