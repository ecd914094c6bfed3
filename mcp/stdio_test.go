package mcp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/mcp"
)

// TestStdioOversizedMessage: a message over the limit is answered with an error naming the
// limit, wherever its id is, and the server keeps serving the same connection (issue 25: one
// oversized message ended the stdio server and every session it held).
func TestStdioOversizedMessage(t *testing.T) {
	const limit = 1 << 20
	s := mcp.New(&deadBackend{}, mcp.Options{Logger: quiet, MaxMessageBytes: limit})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- s.ServeStdio(t.Context(), inR, outW); outW.Close() }()
	answers := bufio.NewReader(outR)
	send := func(msg string) {
		t.Helper()
		if _, err := io.WriteString(inW, msg+"\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	type answer struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	read := func() answer {
		t.Helper()
		line, err := answers.ReadBytes('\n')
		if err != nil {
			t.Fatalf("read: %v (the server stopped)", err)
		}
		var a answer
		if err := json.Unmarshal(line, &a); err != nil {
			t.Fatalf("answer %q: %v", line, err)
		}
		return a
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if a := read(); a.Error != nil || string(a.ID) != "1" {
		t.Fatalf("initialize: %+v", a)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	big := strings.Repeat("x", limit)
	for i, tt := range []struct{ msg, id string }{
		{fmt.Sprintf(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"run_code","arguments":{"language":"python","code":"%s"}},"id":"late"}`, big), `"late"`},
		{fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"python","code":"%s","id":99}}}`, big), `7`},
		{fmt.Sprintf(`{"jsonrpc":"2.0","method":"tools/call","params":{"code":"%s"}}`, big), `null`},
	} {
		send(tt.msg)
		a := read()
		if a.Error == nil || string(a.ID) != tt.id || !strings.Contains(a.Error.Message, fmt.Sprint(limit)) {
			t.Errorf("oversized message %d: answer %+v, want an error for id %s naming the limit", i, a, tt.id)
		}
		send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, 100+i))
		if a := read(); a.Error != nil || string(a.ID) != fmt.Sprint(100+i) || !strings.Contains(string(a.Result), "run_code") {
			t.Fatalf("after oversized message %d, tools/list: %+v (the server must keep serving)", i, a)
		}
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Errorf("ServeStdio: %v", err)
	}
}
