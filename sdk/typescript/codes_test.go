// Package tssdk holds the Go side of the TypeScript SDK's tests: the error table it is generated
// from, and the node suites run against a real daemon.
package tssdk

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/server/api"
)

var update = flag.Bool("update", false, "rewrite src/gen/codes.ts from sbtypes.Codes")

const codesFile = "src/gen/codes.ts"

// className is the TypeScript class of a wire code: not_found → NotFoundError.
func className(code string) string {
	var b strings.Builder
	for _, part := range strings.Split(code, "_") {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String() + "Error"
}

// renderCodes is src/gen/codes.ts: one class per row of the one wire table (sbtypes.Codes), in
// its order, plus the two codes of no class (canceled, internal), so the SDK decodes exactly
// the codes the daemon sends.
func renderCodes() []byte {
	var b bytes.Buffer
	b.WriteString("// Code generated from sandbox/sbtypes/codes.go (the one wire table) by sdk/typescript's\n")
	b.WriteString("// TestCodesTable; DO NOT EDIT. Regenerate: go test ./sdk/typescript -run TestCodesTable -update\n\n")
	b.WriteString("import { AirlockError } from '../error-base.js';\n\n")
	type row struct {
		code, class, doc string
		status           int
	}
	var rows []row
	for _, c := range sbtypes.Codes {
		rows = append(rows, row{c.Code, className(c.Code), "Go's sandbox.Err" + strings.TrimSuffix(className(c.Code), "Error") + " (" + c.Class.Error() + ")", c.Status})
	}
	rows = append(rows,
		row{api.CodeCanceled, className(api.CodeCanceled), "the request was cancelled (context.Canceled)", 499},
		row{api.CodeInternal, className(api.CodeInternal), "an error of no class: a bug", 500},
	)
	for _, r := range rows {
		fmt.Fprintf(&b, "/** Code %q, HTTP %d: %s. */\n", r.code, r.status, r.doc)
		fmt.Fprintf(&b, "export class %s extends AirlockError {\n", r.class)
		fmt.Fprintf(&b, "  static override readonly code = %q;\n  static override readonly status = %d;\n", r.code, r.status)
		fmt.Fprintf(&b, "  override readonly name: string = %q;\n}\n\n", r.class)
	}
	b.WriteString("/** Every wire code and its class, in the table's order (the first class of a status wins). */\n")
	b.WriteString("export const errorClasses = [\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "  %s,\n", r.class)
	}
	b.WriteString("] as const;\n\n/** A wire code. */\nexport type ErrorCode = (typeof errorClasses)[number]['code'];\n")
	return b.Bytes()
}

// TestCodesTable fails when src/gen/codes.ts is not what the wire table generates.
func TestCodesTable(t *testing.T) {
	want := renderCodes()
	if *update {
		if err := os.WriteFile(codesFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(codesFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: go test ./sdk/typescript -run TestCodesTable -update", codesFile)
	}
}
