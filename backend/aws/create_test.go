package aws_test

import (
	"errors"
	"strings"
	"testing"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/aws/fake"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestCreateRefusesBeforeRunning: what a MicroVM cannot be is refused, naming the field or
// capability, before RunMicrovm is called.
func TestCreateRefusesBeforeRunning(t *testing.T) {
	f := noGuests(t)
	i64 := func(v int64) *int64 { return &v }
	big := map[string]string{"BIG": strings.Repeat("x", awsb.MaxRunHookPayload)}
	cases := []struct {
		name      string
		noConn    bool
		mod       func(d *spec.Sandbox)
		class     error
		mentions  string
		refusalOf capability.Name
	}{
		{name: "another image reference", mod: func(d *spec.Sandbox) { d.Image.Ref = "python:3.12" }, class: sandbox.ErrRefused, mentions: "aws.imageRef"},
		{name: "a host image", mod: func(d *spec.Sandbox) { d.Image = spec.Image{Host: true} }, class: sandbox.ErrRefused, refusalOf: capability.ImageHost},
		{name: "deny without a connector", noConn: true, class: sandbox.ErrRefused, refusalOf: capability.EgressDeny},
		{name: "a memory ceiling", mod: func(d *spec.Sandbox) { d.Limits.Memory = "1Gi" }, class: sandbox.ErrRefused, refusalOf: capability.EnforcedLimits},
		{name: "an idle timeout under the lifetime", mod: func(d *spec.Sandbox) { d.Session.IdleTimeoutSeconds = i64(60) }, class: sandbox.ErrRefused, refusalOf: capability.IdleTimeout},
		{name: "a lifetime past 8 h", mod: func(d *spec.Sandbox) { d.Session.MaxLifetimeSeconds = i64(28801) }, class: sandbox.ErrRefused, mentions: "28800"},
		{name: "labels", mod: func(d *spec.Sandbox) { d.Labels = map[string]string{"a": "b"} }, class: sandbox.ErrRefused, refusalOf: capability.Labels},
		{name: "env past the run hook's payload", mod: func(d *spec.Sandbox) { d.Env = big }, class: sandbox.ErrInvalid, mentions: "run hook"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := awsb.Config{Region: testRegion, Endpoint: f.URL(), Image: testImage, ImageRef: testImageRef,
				EgressConnector: testConnector, StateDir: t.TempDir(), Credentials: fake.Credentials()}
			if tc.noConn {
				c.EgressConnector = ""
			}
			b, err := awsb.New(t.Context(), c)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			d := testDecl("refused")
			if tc.mod != nil {
				tc.mod(&d)
			}
			d = plan.Defaults(b.Platform(), b.Capabilities(t.Context()), d)
			before := f.Calls("RunMicrovm")
			_, err = b.Create(t.Context(), d)
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.mentions) {
				t.Fatalf("Create = %v, want %v mentioning %q", err, tc.class, tc.mentions)
			}
			if tc.refusalOf != "" {
				var r *plan.Refusal
				if !errors.As(err, &r) || !strings.Contains(err.Error(), string(tc.refusalOf)) {
					t.Errorf("Create = %v, want a refusal naming %s", err, tc.refusalOf)
				}
			}
			if n := f.Calls("RunMicrovm") - before; n != 0 {
				t.Errorf("RunMicrovm called %d times for a refused declaration", n)
			}
		})
	}
}
