// Command airlock is the CLI: plan and inspect sandbox declarations, and run sandboxes.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
