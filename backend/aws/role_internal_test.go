package aws

import (
	"strings"
	"testing"
)

// TestRoleArn: the role's path and name may be 1 to 512 bytes, counted outside the pattern.
func TestRoleArn(t *testing.T) {
	for _, tc := range []struct {
		arn  string
		want bool
	}{
		{"arn:aws:iam::123456789012:role/airlock-build", true},
		{"arn:aws-cn:iam::123456789012:role/service-role/build@x", true},
		{"arn:aws:iam::123456789012:role/" + strings.Repeat("r", 512), true},
		{"arn:aws:iam::123456789012:role/" + strings.Repeat("r", 513), false},
		{"arn:aws:iam::123456789012:role/", false},
		{"arn:aws:iam::12345678901:role/x", false},
		{"arn:aws:iam::123456789012:user/x", false},
		{"arn:aws:iam::123456789012:role/a b", false},
	} {
		if got := roleArn(tc.arn); got != tc.want {
			t.Errorf("roleArn(%.60q) = %v, want %v", tc.arn, got, tc.want)
		}
	}
}
