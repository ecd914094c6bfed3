// Command sdk is the README's SDK example: a sandbox from the daemon, Python in it, output streamed back.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func main() {
	ctx := context.Background()
	c, err := client.FromEnv() // $AIRLOCK_SOCKET, else /run/airlock/airlock.sock
	if err != nil {
		log.Fatal(err)
	}
	// A lifetime of 10 minutes: the default idle timeout then equals it, which the local
	// runtime enforces (it has no separate idle timer yet, and airlock never pretends).
	sb, err := c.Create(ctx, spec.Sandbox{ID: "hello", Image: spec.Image{Host: true}, Session: spec.Session{MaxLifetimeSeconds: new(int64(600))}})
	if err != nil {
		log.Fatal(err)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", "print(6 * 7)"}, Timeout: 10 * time.Second}, os.Stdout, os.Stderr)
	if terr := sb.Terminate(ctx); err == nil {
		err = terr
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", res.ExitCode)
}
