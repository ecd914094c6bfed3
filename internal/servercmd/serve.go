// Package servercmd holds the daemon commands, serve and mcp: the airlock-server binary, kept out of the one-shot CLI (DESIGN.md, "Start-up is on the hot path").
package servercmd

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/server"
	"github.com/airlock-sandbox/airlock/server/api"
)

// Commands are the constructors of the commands airlock-server runs.
var Commands = []func(*cli.Globals) *cobra.Command{NewServeCmd, NewMCPCmd}

type serveFlags struct {
	socket        string
	socketMode    string
	socketGroup   string
	listen        string
	tlsCert       string
	tlsKey        string
	apiKeyFile    string
	requireKey    bool
	signingKey    string
	maxTokenTTL   time.Duration
	templatesFile string
	logLevel      string
	logFormat     string
	backend       cli.BackendFlags
}

// NewServeCmd is airlock serve.
func NewServeCmd(*cli.Globals) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve [--socket PATH] [--listen ADDR --tls-cert F --tls-key F] [--api-key-file F]",
		Short: cli.ServeShort,
		Long: `Serve the airlock HTTP API (docs/api.md) over the platform --platform chooses (default auto:
the local runtime where this host runs it, else a docker-compatible engine); GET /healthz and
GET /v1/capabilities name it.

On the unix socket (default ` + api.DefaultSocket + `, mode 0660) the socket's file
permissions are the credential: whoever can connect is the daemon's caller, unless
--require-api-key asks for a key there too. On TCP (--listen) every call needs
"Authorization: Bearer <API key>" (from --api-key-file) or a delegated capability token
minted with POST /v1/sandboxes/{id}/tokens ('airlock sandbox token'); TCP is served with TLS
(--tls-cert/--tls-key), and without TLS only on a loopback address.

Delegated tokens are signed with the daemon's own key (--signing-key, created on first start),
not with any sandbox agent's key. Stopping the daemon leaves sandboxes running; the next
start adopts them.`,
		Example: `  sudo airlock serve
  sudo airlock serve --socket-group airlock --templates templates.yaml
  sudo airlock serve --listen :7443 --tls-cert cert.pem --tls-key key.pem --api-key-file /etc/airlock/api-keys

  curl --unix-socket /run/airlock/airlock.sock http://airlock/v1/sandboxes`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runServe(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.socket, "socket", api.DefaultSocket, "unix socket to listen on")
	fl.StringVar(&f.socketMode, "socket-mode", "0660", "permission bits of the socket (octal): who may connect")
	fl.StringVar(&f.socketGroup, "socket-group", "", "group owning the socket (name or gid); its members may connect with mode 0660")
	fl.StringVar(&f.listen, "listen", "", "also serve TCP on host:port (needs --tls-cert/--tls-key unless loopback)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "TLS certificate (PEM) for --listen")
	fl.StringVar(&f.tlsKey, "tls-key", "", "TLS private key (PEM) for --listen")
	fl.StringVar(&f.apiKeyFile, "api-key-file", "", "file of API keys, one a line (mode 600)")
	fl.BoolVar(&f.requireKey, "require-api-key", false, "ask for an API key on the unix socket as well")
	fl.StringVar(&f.signingKey, "signing-key", server.DefaultSigningKeyFile, "the daemon's token signing key (created when absent, mode 600)")
	fl.DurationVar(&f.maxTokenTTL, "max-token-ttl", server.DefaultMaxTokenTTL, "longest lifetime of a delegated token")
	fl.StringVar(&f.templatesFile, "templates", "", `Stack file whose sandboxes are templates, named by id ({"template": "<id>"})`)
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fl.StringVar(&f.logFormat, "log-format", "text", "log format on stderr: text or json")
	f.backend.Add(cmd)
	return cmd
}

func (f *serveFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, cli.UsageError("--log-level %q: allowed are debug, info, warn, error", f.logLevel)
	}
	o := &slog.HandlerOptions{Level: level}
	switch f.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, cli.UsageError("--log-format %q: allowed are text and json", f.logFormat)
}

// socketOwner parses --socket-mode and --socket-group.
func (f *serveFlags) socketOwner() (os.FileMode, int, error) {
	mode, err := strconv.ParseUint(f.socketMode, 8, 32)
	if err != nil || mode > 0o777 {
		return 0, 0, cli.UsageError("--socket-mode %q: want octal permission bits, e.g. 0660", f.socketMode)
	}
	if mode&0o007 != 0 {
		return 0, 0, cli.UsageError("--socket-mode %s lets every local user drive the daemon; use a group (--socket-group) instead", f.socketMode)
	}
	gid := -1
	if f.socketGroup != "" {
		if n, err := strconv.Atoi(f.socketGroup); err == nil {
			gid = n
		} else if g, err := user.LookupGroup(f.socketGroup); err == nil {
			gid, _ = strconv.Atoi(g.Gid)
		} else {
			return 0, 0, cli.UsageError("--socket-group %q: %v", f.socketGroup, err)
		}
	}
	return os.FileMode(mode), gid, nil
}

// tcpEndpoint checks --listen and its TLS flags.
func (f *serveFlags) tcpTLS() (*tls.Config, error) {
	if f.listen == "" {
		if f.tlsCert != "" || f.tlsKey != "" {
			return nil, cli.UsageError("--tls-cert/--tls-key need --listen")
		}
		return nil, nil
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, cli.UsageError("--tls-cert and --tls-key go together")
	}
	if f.tlsCert == "" {
		if err := cli.CheckLoopback(f.listen); err != nil {
			return nil, cli.UsageError("--listen %s without TLS: the address is not loopback; give --tls-cert and --tls-key", f.listen)
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
	if err != nil {
		return nil, cli.UsageError("--tls-cert/--tls-key: %v", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func runServe(cmd *cobra.Command, f *serveFlags) error {
	log, err := f.logger(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	mode, gid, err := f.socketOwner()
	if err != nil {
		return err
	}
	tlsConf, err := f.tcpTLS()
	if err != nil {
		return err
	}
	opts := server.Options{RequireAPIKeyOnUnix: f.requireKey, MaxTokenTTL: f.maxTokenTTL, Logger: log}
	if f.apiKeyFile != "" {
		if opts.APIKeys, err = server.LoadAPIKeys(f.apiKeyFile); err != nil {
			return cli.UsageError("--api-key-file: %v", err)
		}
	} else if f.requireKey {
		return cli.UsageError("--require-api-key needs --api-key-file")
	}
	if f.templatesFile != "" {
		if opts.Templates, err = server.LoadTemplates(f.templatesFile); err != nil {
			return cli.UsageError("--templates: %v", err)
		}
	}
	if opts.SigningKey, err = server.LoadOrCreateSigningKey(f.signingKey); err != nil {
		return fmt.Errorf("--signing-key: %w", err)
	}

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, ch, err := f.backend.Open(ctx, io.Discard, cmd.ErrOrStderr(), log)
	if err != nil {
		return err
	}
	defer b.Close() // the sandboxes live on; the next start adopts them
	log.Info("platform", "platform", ch.Platform, "engine", ch.Engine, "why", ch.Why)
	opts.Backend = b
	srv, err := server.New(opts)
	if err != nil {
		return err
	}
	uln, err := server.ListenUnix(f.socket, mode, gid)
	if err != nil {
		return fmt.Errorf("--socket: %w", err)
	}
	eps := []server.Endpoint{{Listener: uln, Transport: server.Unix}}
	if f.listen != "" {
		tln, err := net.Listen("tcp", f.listen)
		if err != nil {
			uln.Close()
			return fmt.Errorf("--listen: %w", err)
		}
		eps = append(eps, server.Endpoint{Listener: tln, Transport: server.TCP, TLS: tlsConf})
	}
	err = srv.Serve(ctx, eps...)
	if err == nil || ctx.Err() != nil {
		log.Info("stopped", "signal", context.Cause(ctx))
		return nil
	}
	return err
}
