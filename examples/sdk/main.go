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
	// README:begin
	c, err := client.FromEnv() // $AIRLOCK_SOCKET, else /run/airlock/airlock.sock
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, spec.Sandbox{ID: "hello", Image: spec.Image{Host: true}})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Terminate(ctx)
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", "print(6 * 7)"}, Timeout: 10 * time.Second}, os.Stdout, os.Stderr)
	// README:end
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", res.ExitCode)
}
