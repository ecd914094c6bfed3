package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Quantities at or above these bounds are refused as too large. The bound itself is excluded
// because resource.ParseQuantity saturates larger binary-suffixed values ("8Ei") to MaxInt64
// instead of failing, so MaxInt64 cannot be told apart from an overflow.
var (
	maxMilliQuantity = resource.NewMilliQuantity(math.MaxInt64, resource.DecimalSI)
	maxQuantity      = resource.NewQuantity(math.MaxInt64, resource.DecimalSI)
)

// UnmarshalJSON accepts a string or a bare number, keeping the number's text as written.
func (q *Quantity) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*q = Quantity(s)
		return nil
	case json.Valid(data) && (data[0] == '-' || (data[0] >= '0' && data[0] <= '9')):
		*q = Quantity(data)
		return nil
	}
	return fmt.Errorf("%w: quantity must be a string such as \"512Mi\" or a number, got %s", ErrInvalid, data)
}

// Bounds on a quantity's text, checked before any arithmetic: resource.Quantity compares values
// with big-number arithmetic whose cost grows with the exponent, so "1e999999999" would stall a
// caller for minutes. No sensible limit needs more.
const (
	maxQuantityLength   = 64
	maxQuantityExponent = 30
)

// QuantityPattern is the quantity grammar airlock accepts: Kubernetes' published pattern with
// integer exponents only. Text must match it and also parse with resource.ParseQuantity, which
// on its own accepts oddities such as "Mi" (zero) and "e3".
const QuantityPattern = `^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$`

// Compiled on first use, not at package init: most binaries linking spec never parse one.
var (
	quantityRE         = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(QuantityPattern) })
	quantityExponentRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[eE]([-+]?[0-9]+)$`) })
)

// Parse reads the quantity with the Kubernetes grammar. Quantities longer than 64 characters
// or with a decimal exponent beyond ±30 are refused.
func (q Quantity) Parse() (resource.Quantity, error) {
	if q == "" {
		return resource.Quantity{}, fmt.Errorf("%w: empty quantity", ErrInvalid)
	}
	if len(q) > maxQuantityLength {
		return resource.Quantity{}, fmt.Errorf("%w: quantity is longer than %d characters", ErrInvalid, maxQuantityLength)
	}
	if !quantityRE().MatchString(string(q)) {
		return resource.Quantity{}, fmt.Errorf("%w: quantity %q: write a number with an optional suffix (n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) or exponent (e3)", ErrInvalid, string(q))
	}
	if m := quantityExponentRE().FindStringSubmatch(string(q)); m != nil {
		if e, err := strconv.Atoi(m[1]); err != nil || e > maxQuantityExponent || e < -maxQuantityExponent {
			return resource.Quantity{}, fmt.Errorf("%w: quantity %q: the exponent is beyond ±%d", ErrInvalid, string(q), maxQuantityExponent)
		}
	}
	rq, err := resource.ParseQuantity(string(q))
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%w: quantity %q: %v", ErrInvalid, string(q), err)
	}
	return rq, nil
}

// MilliValue is the quantity in thousandths ("250m" is 250, "2" is 2000). It refuses a quantity
// that is not a whole number of thousandths or does not fit an int64, rather than rounding.
func (q Quantity) MilliValue() (int64, error) {
	rq, err := q.Parse()
	if err != nil {
		return 0, err
	}
	if a := abs(rq); a.Cmp(*maxMilliQuantity) >= 0 {
		return 0, fmt.Errorf("%w: quantity %q is too large", ErrInvalid, string(q))
	}
	m := rq.MilliValue()
	if resource.NewMilliQuantity(m, resource.DecimalSI).Cmp(rq) != 0 {
		return 0, fmt.Errorf("%w: quantity %q is not a whole number of thousandths (1m is the smallest step)", ErrInvalid, string(q))
	}
	return m, nil
}

// Bytes is the quantity as a whole number ("1Ki" is 1024). It refuses a fractional quantity
// or one that does not fit an int64, rather than rounding.
func (q Quantity) Bytes() (int64, error) {
	rq, err := q.Parse()
	if err != nil {
		return 0, err
	}
	if a := abs(rq); a.Cmp(*maxQuantity) >= 0 {
		return 0, fmt.Errorf("%w: quantity %q is too large", ErrInvalid, string(q))
	}
	v := rq.Value()
	if resource.NewQuantity(v, resource.DecimalSI).Cmp(rq) != 0 {
		return 0, fmt.Errorf("%w: quantity %q is not a whole number of bytes", ErrInvalid, string(q))
	}
	return v, nil
}

// CPUMillis is the CPU limit in millicores; an unset limit is the default.
func (l Limits) CPUMillis() (int64, error) { return orDefault(l.CPU, DefaultCPU).MilliValue() }

// MemoryBytes is the memory limit in bytes; an unset limit is the default.
func (l Limits) MemoryBytes() (int64, error) { return orDefault(l.Memory, DefaultMemory).Bytes() }

// DiskBytes is the disk limit in bytes; an unset limit is the default.
func (l Limits) DiskBytes() (int64, error) { return orDefault(l.Disk, DefaultDisk).Bytes() }

// Processes is the process limit; an unset limit is the default.
func (l Limits) Processes() int64 {
	if l.MaxProcesses == nil {
		return DefaultMaxProcesses
	}
	return *l.MaxProcesses
}

func abs(q resource.Quantity) resource.Quantity {
	if q.Sign() < 0 {
		q = q.DeepCopy()
		q.Neg()
	}
	return q
}

func orDefault(q, def Quantity) Quantity {
	if q == "" {
		return def
	}
	return q
}
