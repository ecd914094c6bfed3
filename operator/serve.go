package operator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// CertReloader serves the certificate in CertFile/KeyFile and reads them again when either file
// changes (a renewed Secret, rotated by cert-manager or by hand), so the broker never needs a
// restart for a new certificate. A changed pair that does not load is logged and the previous
// certificate kept: an expired certificate is the clients' refusal, a broker down is everyone's.
type CertReloader struct {
	CertFile, KeyFile string
	Log               *slog.Logger

	mu    sync.Mutex
	cert  *tls.Certificate
	stamp [2]fileStamp
}

// fileStamp identifies a file's content without reading it: a Secret volume swaps a symlink to a
// new directory, so the target's inode changes; an in-place write changes size or mtime.
type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path) // follows the Secret volume's symlinks to the current files
	if err != nil {
		return fileStamp{}, err
	}
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), st.Ino
	}
	return s, nil
}

// Load reads the pair now; the broker refuses to start without a certificate.
func (r *CertReloader) Load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reload()
}

func (r *CertReloader) reload() error {
	cs, err1 := stampOf(r.CertFile)
	ks, err2 := stampOf(r.KeyFile)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if r.cert != nil && r.stamp == [2]fileStamp{cs, ks} {
		return nil
	}
	c, err := tls.LoadX509KeyPair(r.CertFile, r.KeyFile)
	if err != nil {
		return fmt.Errorf("load broker certificate %s, %s: %w", r.CertFile, r.KeyFile, err)
	}
	first := r.cert == nil
	r.cert, r.stamp = &c, [2]fileStamp{cs, ks}
	if !first && r.Log != nil {
		r.Log.Info("broker certificate reloaded", "cert", r.CertFile, "notAfter", c.Leaf.NotAfter)
	}
	return nil
}

// GetCertificate implements tls.Config.GetCertificate: two stats per handshake, a read only when
// the files changed.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.reload(); err != nil {
		if r.cert == nil {
			return nil, err
		}
		if r.Log != nil {
			r.Log.Warn("broker certificate changed but does not load; serving the previous one", "err", err)
		}
	}
	return r.cert, nil
}

// BrokerServer serves a Broker and shuts down gracefully: when its context ends it reports not
// ready (so the Service stops sending it claims), stops accepting connections, and lets the
// claims in flight finish, for up to DrainTimeout.
type BrokerServer struct {
	Broker *Broker
	// TLS, when set, serves HTTPS with the certificate it reloads.
	TLS          *CertReloader
	DrainTimeout time.Duration
	Log          *slog.Logger

	draining atomic.Bool
}

// Handler is the broker's routes with a /healthz that turns 503 while draining.
func (s *BrokerServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", s.Broker.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s.draining.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// Serve serves on ln until ctx ends, then drains. It returns nil after a complete drain, an error
// if serving failed or claims were still running at DrainTimeout (their connections are closed).
func (s *BrokerServer) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		// Request contexts outlive ctx: a claim in flight finishes on its own.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	if s.TLS != nil {
		if err := s.TLS.Load(); err != nil {
			return err
		}
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.TLS.GetCertificate}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.draining.Store(true)
	timeout := s.DrainTimeout
	if timeout <= 0 {
		timeout = 20 * time.Second
	}
	if s.Log != nil {
		s.Log.Info("broker draining", "timeout", timeout)
	}
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := srv.Shutdown(dctx) // closes the listener, then waits for requests in flight
	<-errc                    // Serve returned ErrServerClosed
	if err != nil {
		srv.Close()
		return fmt.Errorf("broker drain: claims still in flight after %v: %w", timeout, err)
	}
	return nil
}
