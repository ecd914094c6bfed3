package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/server/api"
)

// reqState is what every layer of one request shares: its id and its logger.
type reqState struct {
	id  string
	log *slog.Logger
}

type stateKey struct{}

func stateOf(ctx context.Context) *reqState {
	if rs, ok := ctx.Value(stateKey{}).(*reqState); ok {
		return rs
	}
	return &reqState{log: slog.Default()}
}

// validRequestID accepts a caller's id only when it is short and plain, so that it is safe to
// echo in a header and a log line.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// recorder remembers the status and size of an answer for the access log and metrics.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach Flush and EnableFullDuplex.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// withRequestID gives every request an id (the caller's X-Request-Id when it is plain, else a
// fresh one), echoes it, puts it on every log line of the request, and logs the outcome.
func (s *Server) withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(api.RequestIDHeader)
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(api.RequestIDHeader, id)
		rs := &reqState{id: id, log: s.log.With("request_id", id)}
		rec := &recorder{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), stateKey{}, rs))
		start := time.Now()
		defer func() {
			status := rec.status
			if status == 0 {
				status = http.StatusOK
			}
			route := r.Pattern // set by the mux on this request
			if route == "" {
				route = "unmatched"
			}
			aborted := recover()
			lvl := slog.LevelInfo
			if r.URL.Path == "/healthz" || r.URL.Path == "/metrics" {
				lvl = slog.LevelDebug
			}
			if aborted != nil {
				lvl = slog.LevelWarn
			}
			rs.log.Log(r.Context(), lvl, "request", "method", r.Method, "path", r.URL.Path, "route", route,
				"status", status, "bytes", rec.bytes, "duration", time.Since(start), "aborted", aborted != nil)
			s.metrics.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
			if aborted != nil {
				panic(aborted) // net/http closes the connection (http.ErrAbortHandler: silently)
			}
		}()
		next.ServeHTTP(rec, r)
	})
}
