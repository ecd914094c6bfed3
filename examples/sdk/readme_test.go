package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEShowsThisExample keeps the README's SDK snippet identical to the program the
// server tests compile and run.
func TestREADMEShowsThisExample(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "// README:begin\n")
	if !ok {
		t.Fatal("main.go has no README:begin marker")
	}
	body, _, ok = strings.Cut(body, "\t// README:end")
	if !ok {
		t.Fatal("main.go has no README:end marker")
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	if want := strings.Join(lines, "\n"); !strings.Contains(string(readme), want) {
		t.Errorf("README.md does not contain the SDK example from examples/sdk/main.go; paste:\n%s", want)
	}
}
