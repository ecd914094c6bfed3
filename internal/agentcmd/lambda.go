package agentcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/wire"
)

// The guest of an AWS Lambda MicroVM (backend/aws): Lambda calls the image's lifecycle hooks
// under hookPrefix on the hooks port; the run hook's body is the session's agent.Config (the
// binding's run hook payload), and the agent then serves its protocol on the agent port, which
// the MicroVM's endpoint reaches with X-aws-proxy-port.
const (
	hookPrefix = "/aws/lambda-microvms/runtime/v1/"
	// Defaults: the hooks port is the image's (8080, Lambda's default proxy port), the agent's
	// is backend/aws.AgentPort; code runs as uid/gid 60000, which nothing in the image uses.
	lambdaHooksListen = "tcp:0.0.0.0:8080"
	lambdaAgentListen = "tcp:0.0.0.0:8971"
	lambdaCodeID      = 60000
)

// lambda serves the hooks until SIGTERM or the session's agent ends.
func lambda(args []string) int {
	hooks, listen := lambdaHooksListen, lambdaAgentListen
	for len(args) > 0 {
		if len(args) < 2 {
			fmt.Fprintf(os.Stderr, "airlock-agent lambda: %s needs a value\n%s", args[0], usage)
			return 2
		}
		switch args[0] {
		case "--hooks":
			hooks = args[1]
		case "--listen":
			listen = args[1]
		default:
			fmt.Fprintf(os.Stderr, "airlock-agent lambda: unknown flag %q\n%s", args[0], usage)
			return 2
		}
		args = args[2:]
	}
	network, addr, ok := strings.Cut(hooks, ":")
	if !ok || network != "tcp" {
		fmt.Fprintf(os.Stderr, "airlock-agent lambda: --hooks %q is not tcp:host:port\n", hooks)
		return 2
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock-agent lambda: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	g := &lambdaGuest{listen: listen, ctx: ctx, ended: make(chan error, 1)}
	hs := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	fmt.Fprintf(os.Stderr, "airlock-agent: lifecycle hooks on %s\n", ln.Addr())
	var code int
	select {
	case <-ctx.Done():
	case err := <-g.ended:
		if err != nil && !errors.Is(err, agent.ErrLifetime) {
			fmt.Fprintf(os.Stderr, "airlock-agent lambda: %v\n", err)
			code = 1
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return code
}

// lambdaGuest answers the lifecycle hooks; its run hook starts the session's agent.
type lambdaGuest struct {
	listen string
	ctx    context.Context
	ended  chan error

	mu      sync.Mutex
	started bool
}

func (g *lambdaGuest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hook, ok := strings.CutPrefix(r.URL.Path, hookPrefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	switch hook {
	case "ready", "validate", "suspend", "terminate":
		// Nothing to wait for at image build (the agent is this binary), nothing to save.
		w.WriteHeader(http.StatusOK)
	case "resume":
		// The kernel's CSPRNG (getrandom, which crypto/rand reads) is reseeded by the VM's
		// generation counter; the agent keeps no random state of its own across a snapshot.
		w.WriteHeader(http.StatusOK)
	case "run":
		g.run(w, r)
	default:
		http.NotFound(w, r)
	}
}

// run starts the agent with the payload's configuration and answers once it listens.
func (g *lambdaGuest) run(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		http.Error(w, "the session's agent is already running", http.StatusConflict)
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxConfig+1))
	if err != nil || len(b) > maxConfig {
		http.Error(w, fmt.Sprintf("run hook payload: %v", err), http.StatusBadRequest)
		return
	}
	cfg, err := lambdaConfig(b, g.listen)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	up := make(chan string, 1)
	go func() {
		g.ended <- agent.Serve(g.ctx, cfg, agent.Hooks{Ready: func(addr string) { up <- addr }})
	}()
	select {
	case addr := <-up:
		g.started = true
		fmt.Fprintf(os.Stderr, "airlock-agent: sandbox %s listening on %s\n", cfg.SandboxID, addr)
		w.WriteHeader(http.StatusOK)
	case err := <-g.ended:
		g.ended <- err
		http.Error(w, fmt.Sprintf("agent: %v", err), http.StatusInternalServerError)
	case <-time.After(30 * time.Second):
		http.Error(w, "agent did not start listening in 30 s", http.StatusInternalServerError)
	}
}

// lambdaConfig is the payload's agent.Config with what the guest decides: where the agent
// listens, the files root, the code's uid and gid, and the run policy (wire.NewPolicy) from
// the payload's env (the declaration's) and maxTimeout (the lifetime) and the image's
// environment, which only the guest sees.
func lambdaConfig(payload []byte, listen string) (agent.Config, error) {
	var cfg agent.Config
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("run hook payload: %w", err)
	}
	if cfg.Listen != "" || cfg.FilesRoot != "" || cfg.CodeUID != 0 || cfg.CodeGID != 0 || cfg.AllowRootCode ||
		len(cfg.DenyPaths) > 0 || cfg.DefaultOutputCap != 0 || cfg.IdleTimeout != 0 {
		return cfg, errors.New("run hook payload: listen, filesRoot, codeUid, codeGid, allowRootCode, denyPaths, defaultOutputCap and idleTimeout are the guest's to set")
	}
	cfg.Listen, cfg.FilesRoot = listen, "/"
	cfg.CodeUID, cfg.CodeGID = lambdaCodeID, lambdaCodeID
	if cfg.Workdir == "" {
		return cfg, errors.New("run hook payload: workdir is empty")
	}
	// The image's environment (its ENV lines reach this process) under the declaration's.
	var imageEnv []string
	for _, kv := range os.Environ() {
		if k, _, ok := strings.Cut(kv, "="); ok && (k == "PATH" || k == "LANG" || k == "LC_ALL") {
			imageEnv = append(imageEnv, kv)
		}
	}
	cfg.Policy = wire.NewPolicy(wire.PolicyFor{Workdir: cfg.Workdir, User: "sandbox", ImageEnv: imageEnv, Env: cfg.Env, Lifetime: cfg.MaxTimeout})
	// The workdir is the code's: made here, as the image may not have it.
	if err := os.MkdirAll(cfg.Workdir, 0o755); err != nil {
		return cfg, fmt.Errorf("workdir: %w", err)
	}
	if err := os.Chown(cfg.Workdir, lambdaCodeID, lambdaCodeID); err != nil {
		return cfg, fmt.Errorf("workdir: %w", err)
	}
	return cfg, nil
}
