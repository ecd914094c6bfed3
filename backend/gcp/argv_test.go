package gcp

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// TestArgv is the binding's whole launcher grammar: every call it makes, argument by argument.
func TestArgv(t *testing.T) {
	long := strings.Repeat("x", maxArg+1)
	for _, tc := range []struct {
		name string
		got  func() ([]string, error)
		want []string
		err  error
	}{
		{"run deny", func() ([]string, error) {
			return argvRun(runArgs{name: "airlock-0a", workdir: "/workspace", command: []string{"/bin/sh", "-c", "x"}})
		}, []string{"run", "airlock-0a", "--detach", "--write", "--workdir", "/workspace", "--", "/bin/sh", "-c", "x"}, nil},
		{"run open", func() ([]string, error) {
			return argvRun(runArgs{name: "a", allowEgress: true, command: []string{"/a"}})
		}, []string{"run", "a", "--detach", "--write", "--allow-egress", "--", "/a"}, nil},
		{"run: a flag-like command stays after --", func() ([]string, error) {
			return argvRun(runArgs{name: "a", command: []string{"/a", "--detach"}})
		}, []string{"run", "a", "--detach", "--write", "--", "/a", "--detach"}, nil},
		{"exec with stdin (the bridge)", func() ([]string, error) {
			return argvExec("a", true, []string{"/agent", "bridge", "unix:/tmp/.airlock/agent.sock"})
		}, []string{"exec", "a", "--", "/agent", "bridge", "unix:/tmp/.airlock/agent.sock"}, nil},
		{"exec without stdin", func() ([]string, error) { return argvExec("a", false, []string{"/x"}) },
			[]string{"exec", "a", "--stdin=false", "--", "/x"}, nil},
		{"probe", func() ([]string, error) { return argvProbe("a-1") },
			[]string{"exec", "a-1", "--stdin=false", "--", "/bin/true"}, nil},
		{"delete", func() ([]string, error) { return argvDelete("a-1") }, []string{"delete", "--force", "a-1"}, nil},
		{"a name outside the grammar", func() ([]string, error) { return argvDelete("-rf") }, nil, sandbox.ErrInvalid},
		{"a name with an underscore", func() ([]string, error) { return argvDelete("a_b") }, nil, sandbox.ErrInvalid},
		{"an argument over 128 KiB", func() ([]string, error) { return argvExec("a", false, []string{"/bin/echo", long}) }, nil, sandbox.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.got()
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("argv = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestMarkerWriter: the command's output passes through whole, the status after the marker
// is read off the end wherever the writes split it, and a missing marker is no status.
func TestMarkerWriter(t *testing.T) {
	const m = "\x1eairlock-exit-abc"
	for _, tc := range []struct {
		name   string
		writes []string
		out    string
		code   int
		ok     bool
	}{
		{"plain", []string{"hello\n" + m + " 0\n"}, "hello\n", 0, true},
		{"no newline before the marker", []string{"partial" + m + " 42\n"}, "partial", 42, true},
		{"split everywhere", []string{"ab", "c\n\x1eairl", "ock-exit-a", "bc 25", "5\n"}, "abc\n", 255, true},
		{"long output", []string{strings.Repeat("x", 100000), m + " 3\n"}, strings.Repeat("x", 100000), 3, true},
		{"the marker's text in the output", []string{"\x1eairlock-exit-abd 9\n", m + " 1\n"}, "\x1eairlock-exit-abd 9\n", 1, true},
		{"no marker (the launcher failed)", []string{"sandbox is not running\n"}, "sandbox is not running\n", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			w := &markerWriter{w: capped(&out, 0), marker: []byte(m)}
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write: %d %v", n, err)
				}
			}
			code, ok := w.finish()
			if out.String() != tc.out || code != tc.code || ok != tc.ok {
				t.Errorf("output %q, status %d %v; want %q, %d %v", out.String(), code, ok, tc.out, tc.code, tc.ok)
			}
		})
	}
}

// TestCheckKillScope: an agent whose kill reaches only the process group is refused, naming
// the capability that would not hold; the whole-tree scopes pass.
func TestCheckKillScope(t *testing.T) {
	for _, tc := range []struct {
		scope string
		ok    bool
	}{
		{sbtypes.KillScopeSubreaper, true},
		{sbtypes.KillScopeCgroupV1, true},
		{sbtypes.KillScopeCgroupV2, true},
		{sbtypes.KillScopePgrp, false},
		{"", false},
	} {
		err := checkKillScope("ses-1", sandbox.Health{KillScope: tc.scope})
		if tc.ok && err != nil || !tc.ok && (!errors.Is(err, sandbox.ErrRefused) || !strings.Contains(err.Error(), string(capability.BackgroundProcesses))) {
			t.Errorf("kill scope %q: %v", tc.scope, err)
		}
	}
}
