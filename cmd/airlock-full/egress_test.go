package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
)

// fakeEgressDaemon answers the egress endpoints on a unix socket and records what it was sent.
type fakeEgressDaemon struct {
	mu          sync.Mutex
	bodies      []string
	unsupported bool
}

func (f *fakeEgressDaemon) start(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", api.ContentTypeJSON)
		f.mu.Lock()
		unsupported := f.unsupported
		f.mu.Unlock()
		if unsupported {
			code, status := api.CodeOf(sandbox.ErrUnsupported)
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(api.Error{Code: code, Message: "unsupported: the fake backend cannot change a live sandbox's egress"})
			return
		}
		switch r.Method + " " + r.URL.Path {
		case "PUT /v1/sandboxes/s-1/egress":
			b, _ := io.ReadAll(r.Body)
			f.mu.Lock()
			f.bodies = append(f.bodies, string(b))
			f.mu.Unlock()
			var e spec.Egress
			json.Unmarshal(b, &e)
			json.NewEncoder(w).Encode(api.EgressPolicy{Session: "s-1", Egress: e})
		case "GET /v1/sandboxes/s-1/egress/counters":
			json.NewEncoder(w).Encode(api.EgressCounters{ConnsAllowed: 3, ConnsDenied: 2, BytesSent: 42})
		default:
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.Error{Code: "not_found", Message: "no " + r.URL.Path})
		}
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return sock
}

func (f *fakeEgressDaemon) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.bodies...)
}

func TestEgressCommand(t *testing.T) {
	f := &fakeEgressDaemon{}
	sock := f.start(t)
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		out, err string // substrings
		body     string // what the daemon was sent; "" for nothing
	}{
		{"counters", []string{"s-1"}, 0, "connections denied   2", "", ""},
		{"counters json", []string{"s-1", "-o", "json"}, 0, `"connsAllowed": 3`, "", ""},
		{"domains imply allowDomains", []string{"s-1", "--allow-domain", "api.example.com", "--allow-domain", "*.pypi.org"}, 0,
			"s-1: egress allowDomains api.example.com, *.pypi.org", "", `{"mode":"allowDomains","domains":["api.example.com","*.pypi.org"]}`},
		{"deny", []string{"s-1", "--mode", "deny"}, 0, "s-1: egress deny", "", `{"mode":"deny"}`},
		{"allow json", []string{"s-1", "--mode", "allow", "-o", "json"}, 0, `"mode": "allow"`, "", `{"mode":"allow"}`},
		{"unknown mode", []string{"s-1", "--mode", "wide"}, cli.ExitUsage, "", `--mode "wide": allowed are deny, allow, allowDomains, open`, ""},
		{"domains with allow", []string{"s-1", "--mode", "allow", "--allow-domain", "a.example.com"}, cli.ExitUsage, "", "--allow-domain needs --mode allowDomains", ""},
		{"allowDomains without domains", []string{"s-1", "--mode", "allowDomains"}, cli.ExitUsage, "", "needs at least one --allow-domain", ""},
		{"empty mode", []string{"s-1", "--mode", ""}, cli.ExitUsage, "", `--mode ""`, ""},
		{"no session", []string{}, cli.ExitUsage, "", "want one SESSION", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(f.sent())
			code, out, errs := cliIn(t, "", append([]string{"egress", "--socket", sock}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errs, tc.err) {
				t.Fatalf("exit %d (want %d)\nstdout %q (want %q)\nstderr %q (want %q)", code, tc.code, out, tc.out, errs, tc.err)
			}
			sent := f.sent()[before:]
			switch {
			case tc.body == "" && len(sent) != 0:
				t.Fatalf("the daemon was sent %q", sent)
			case tc.body != "" && (len(sent) != 1 || strings.TrimSpace(sent[0]) != tc.body):
				t.Fatalf("the daemon was sent %q, want %s", sent, tc.body)
			}
		})
	}
	f.mu.Lock()
	f.unsupported = true
	f.mu.Unlock()
	for _, args := range [][]string{{"s-1", "--mode", "allow"}, {"s-1"}} {
		if code, _, errs := cliIn(t, "", append([]string{"egress", "--socket", sock}, args...)...); code != cli.ExitRefused || !strings.Contains(errs, "unsupported") {
			t.Fatalf("%v against a backend without it: exit %d, %q", args, code, errs)
		}
	}
}

// TestEgressCommandDaemon drives a real daemon. Only deny is set: any other mode would attach
// the sandbox to this host's network (the daemon has no test namespace); the SDK and server
// tests cover the other modes in namespaces of their own.
func TestEgressCommandDaemon(t *testing.T) {
	sock := startServe(t)
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sb, err := c.Create(context.Background(), spec.Sandbox{ID: "eg", Image: spec.Image{Host: true}, Session: spec.Session{MaxLifetimeSeconds: new(int64(600))}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Terminate(context.Background())
	if code, out, errs := cliIn(t, "", "egress", "--socket", sock, sb.ID); code != 0 || !strings.Contains(out, "connections allowed  0") {
		t.Fatalf("counters: %d %q %q", code, out, errs)
	}
	if code, out, errs := cliIn(t, "", "egress", "--socket", sock, sb.ID, "--mode", "deny"); code != 0 || out != sb.ID+": egress deny\n" {
		t.Fatalf("deny: %d %q %q", code, out, errs)
	}
	// The daemon's validation, typed across the wire: a field error, exit 1.
	if code, _, errs := cliIn(t, "", "egress", "--socket", sock, sb.ID, "--allow-domain", "10.0.0.1"); code != cli.ExitRefused || !strings.Contains(errs, "egress.domains[0]") {
		t.Fatalf("an IP literal: %d %q", code, errs)
	}
	if code, _, errs := cliIn(t, "", "egress", "--socket", sock, "s-0000000000000000", "--mode", "deny"); code != cli.ExitRefused || !strings.Contains(errs, "not found") {
		t.Fatalf("unknown session: %d %q", code, errs)
	}
}
