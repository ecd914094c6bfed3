package wire_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
)

// TestNewPolicy: the defaults every agent's commands start with, under the image's
// environment, under the declaration's; the runtime's paths and the kernel's refused; one
// output cap; the lifetime bounding deadlines; an idle timeout only where it can end the
// sandbox before its lifetime does.
func TestNewPolicy(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   wire.PolicyFor
		want wire.Policy
	}{
		{"defaults", wire.PolicyFor{Workdir: "/w", Lifetime: time.Hour}, wire.Policy{
			Env:       map[string]string{"PATH": wire.DefaultPath, "HOME": "/w", "LANG": "C.UTF-8"},
			DenyPaths: []string{"/dev", "/proc", "/sys"}, MaxTimeout: time.Hour, DefaultOutputCap: 16 << 20,
		}},
		{"user, image, declaration, runtime paths, idle", wire.PolicyFor{
			Workdir: "/w", User: "sandbox", ImageEnv: []string{"PATH=/img", "LANG=img", "=bad", "NOEQUALS", "I=1=2"},
			Env: map[string]string{"LANG": "decl", "D": "d"}, Lifetime: time.Hour, IdleTimeout: time.Minute,
			RuntimePaths: []string{"/.airlock"},
		}, wire.Policy{
			Env:       map[string]string{"PATH": "/img", "HOME": "/w", "LANG": "decl", "USER": "sandbox", "I": "1=2", "D": "d"},
			DenyPaths: []string{"/.airlock", "/dev", "/proc", "/sys"}, MaxTimeout: time.Hour, DefaultOutputCap: 16 << 20,
			IdleTimeout: time.Minute,
		}},
		{"idle as long as the lifetime", wire.PolicyFor{Workdir: "/w", Lifetime: time.Minute, IdleTimeout: time.Minute}, wire.Policy{
			Env:       map[string]string{"PATH": wire.DefaultPath, "HOME": "/w", "LANG": "C.UTF-8"},
			DenyPaths: []string{"/dev", "/proc", "/sys"}, MaxTimeout: time.Minute, DefaultOutputCap: 16 << 20,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := wire.NewPolicy(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("NewPolicy(%+v)\n = %+v\nwant %+v", tc.in, got, tc.want)
			}
		})
	}
	// The result shares nothing with its input.
	in := wire.PolicyFor{Env: map[string]string{"A": "1"}, RuntimePaths: []string{"/r"}}
	p := wire.NewPolicy(in)
	p.Env["A"], p.DenyPaths[0] = "changed", "/changed"
	if in.Env["A"] != "1" || in.RuntimePaths[0] != "/r" {
		t.Errorf("NewPolicy's result aliases its input: %+v", in)
	}
}
