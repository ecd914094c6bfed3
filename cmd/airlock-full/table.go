package main

import (
	"bytes"
	"io"
	"strings"
	"text/tabwriter"
)

// writeTable writes rows as aligned columns two spaces apart, with no trailing spaces.
func writeTable(w io.Writer, rows [][]string) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		io.WriteString(tw, strings.Join(r, "\t")+"\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var out strings.Builder
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line == "" {
			continue
		}
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteString("\n")
	}
	_, err := io.WriteString(w, out.String())
	return err
}
