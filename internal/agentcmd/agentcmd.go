// Package agentcmd is the airlock-agent command line: serve, init and version, with no flag library.
package agentcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
)

const usage = `usage:
  airlock-agent serve --config <file|->   run the agent with an agent.Config (JSON) from a file or stdin;
                                          exits 3 when its idleTimeout ended it
  airlock-agent init ...                  the local runtime's in-namespace first stage
  airlock-agent lambda [--hooks tcp:H:P] [--listen tcp:H:P]
                                          an AWS Lambda MicroVM's guest: answer the lifecycle
                                          hooks (default tcp:0.0.0.0:8080); the run hook's body
                                          is the session's config; serve it on --listen
                                          (default tcp:0.0.0.0:8971)
  airlock-agent bridge unix:<path>        copy stdin to the agent socket at path and its answers
                                          to stdout (how a launcher's exec reaches the agent)
  airlock-agent version                   print the agent and protocol versions
`

// ExitIdle is serve's exit status when the idle timeout ended the agent (0: stopped by SIGTERM
// or a shutdown call, 1: failed, 2: usage or config).
const ExitIdle = 3

// maxConfig bounds the config file: it is a few hundred bytes, anything near this is a mistake.
const maxConfig = 1 << 20

// Main runs the command and returns the process exit code.
func Main(args []string) int {
	// First, before the init stage or the agent can start anything: descriptors the launcher
	// left without close-on-exec must not pass through to sandboxed commands. Fail closed.
	if err := agent.CloseOnExecFrom(3); err != nil {
		fmt.Fprintf(os.Stderr, "airlock-agent: %v\n", err)
		return 1
	}
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	// One processor for the agent's own Go code unless told otherwise: it relays (requests,
	// pipes, files) and never needs two at once, and with one P a goroutine handing work to
	// another stays on its thread instead of waking a second one, a wakeup that costs tens of
	// microseconds in a VM. The commands it starts are processes of their own, not limited by
	// this. Measured on a live sandbox, exec of true, interleaved: agent CPU -17% per exec.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], os.Stdin)
	case "init":
		return nsinit.Main(args[1:])
	case "lambda":
		return lambda(args[1:])
	case "bridge":
		return bridge(args[1:], os.Stdin, os.Stdout)
	case "version":
		if len(args) != 1 {
			fmt.Fprint(os.Stderr, usage)
			return 2
		}
		fmt.Printf("airlock-agent %s (protocol v%d)\n", agent.Version, wire.ProtocolVersion)
		return 0
	case "help", "-h", "--help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "airlock-agent: unknown command %q\n%s", args[0], usage)
	return 2
}

func serve(args []string, stdin io.Reader) int {
	var src string
	switch {
	case len(args) == 2 && args[0] == "--config":
		src = args[1]
	case len(args) == 1 && len(args[0]) > len("--config=") && args[0][:len("--config=")] == "--config=":
		src = args[0][len("--config="):]
	default:
		fmt.Fprintf(os.Stderr, "airlock-agent serve: want exactly --config <file|->\n%s", usage)
		return 2
	}
	cfg, err := loadConfig(src, stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock-agent serve: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = agent.Serve(ctx, cfg, agent.Hooks{Ready: func(addr string) {
		fmt.Fprintf(os.Stderr, "airlock-agent: listening on %s\n", addr)
	}})
	if errors.Is(err, agent.ErrIdle) {
		fmt.Fprintf(os.Stderr, "airlock-agent serve: %v\n", err)
		return ExitIdle
	}
	if errors.Is(err, agent.ErrLifetime) {
		fmt.Fprintf(os.Stderr, "airlock-agent serve: %v\n", err)
		return 0 // the session ended as declared
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock-agent serve: %v\n", err)
		return 1
	}
	return 0
}

// bridge joins stdin and stdout to one connection to the agent's unix socket: backend/gcp
// reaches an agent inside a Cloud Run sandbox, whose launcher forwards only an exec's stdio,
// by running this through the launcher. It ends when either side closes.
func bridge(args []string, stdin io.Reader, stdout io.Writer) int {
	if len(args) != 1 || len(args[0]) < len("unix:/") || args[0][:len("unix:/")] != "unix:/" {
		fmt.Fprintf(os.Stderr, "airlock-agent bridge: want exactly unix:<absolute socket path>\n%s", usage)
		return 2
	}
	c, err := net.Dial("unix", args[0][len("unix:"):])
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock-agent bridge: %v\n", err)
		return 1
	}
	uc := c.(*net.UnixConn)
	go func() {
		// The caller's end closed (EOF): the agent sees the request side end, answers what it
		// has, then closes; the copy below ends then.
		_, _ = io.Copy(uc, stdin)
		_ = uc.CloseWrite()
	}()
	_, err = io.Copy(stdout, uc)
	uc.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock-agent bridge: %v\n", err)
		return 1
	}
	return 0
}

// loadConfig reads an agent.Config, refusing unknown fields so a typo is an error, not a default.
func loadConfig(src string, stdin io.Reader) (agent.Config, error) {
	var r io.Reader = stdin
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return agent.Config{}, fmt.Errorf("config: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxConfig+1))
	if err != nil {
		return agent.Config{}, fmt.Errorf("config %s: %w", src, err)
	}
	if len(b) > maxConfig {
		return agent.Config{}, fmt.Errorf("config %s: larger than %d bytes", src, maxConfig)
	}
	var cfg agent.Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return agent.Config{}, fmt.Errorf("config %s: %w", src, err)
	}
	if dec.More() {
		return agent.Config{}, fmt.Errorf("config %s: data after the JSON object", src)
	}
	return cfg, nil
}
