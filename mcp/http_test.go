package mcp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/mcp"
)

// TestHTTPOriginAndSessions: the HTTP transport refuses a browser page of another origin
// (the MCP specification's DNS-rebinding rule), and a request without a session id that is
// not an initialize, which would otherwise get a server-side session of its own (issue 25).
func TestHTTPOriginAndSessions(t *testing.T) {
	s := mcp.New(&deadBackend{}, mcp.Options{Logger: quiet})
	defer s.Close(t.Context())
	srv := httptest.NewServer(s.HTTPHandler())
	defer srv.Close()
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	const list = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	tests := []struct {
		name, origin, body string
		status             int
		has                string
	}{
		{"no origin (not a browser)", "", initialize, 200, ""},
		{"loopback origin", "http://localhost:3000", initialize, 200, ""},
		{"loopback ip origin", "http://127.0.0.1:9", initialize, 200, ""},
		{"this server's origin", srv.URL, initialize, 200, ""},
		{"another origin", "http://attacker.example", initialize, 403, "attacker.example"},
		{"rebinding origin with a loopback-looking name", "http://127.0.0.1.attacker.example", initialize, 403, "attacker.example"},
		{"not http", "null", initialize, 403, `"null"`},
		{"no session id, not initialize", "", list, 400, "Mcp-Session-Id"},
		{"no session id, batch with initialize", "", "[" + initialize + "]", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+mcp.HTTPPath, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tt.origin != "" {
				req.Header.Set("Origin", tt.origin)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b strings.Builder
			buf := make([]byte, 4096)
			n, _ := resp.Body.Read(buf)
			b.Write(buf[:n])
			if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
				defer func() {
					del, _ := http.NewRequestWithContext(t.Context(), "DELETE", srv.URL+mcp.HTTPPath, nil)
					del.Header.Set("Mcp-Session-Id", id)
					if r, err := http.DefaultClient.Do(del); err == nil {
						r.Body.Close()
					}
				}()
			} else if tt.status == 200 {
				t.Error("initialize got no session id")
			}
			if tt.status == 0 {
				if resp.StatusCode == 400 && strings.Contains(b.String(), "Mcp-Session-Id") {
					t.Errorf("an initialize in a batch was refused as sessionless: %s", b.String())
				}
				return
			}
			if resp.StatusCode != tt.status || !strings.Contains(b.String(), tt.has) {
				t.Errorf("status %d body %q, want %d naming %q", resp.StatusCode, b.String(), tt.status, tt.has)
			}
		})
	}
}
