// Command airlock-full is the full CLI, which the lean front (airlock) hands every command it does not serve: plan and inspect sandbox declarations, and run sandboxes.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
