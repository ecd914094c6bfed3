package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
)

// withAgent runs fn with the session's agent; path confinement and every file rule are the
// agent's, so the server only relays.
func (s *Server) withAgent(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, a sandbox.Agent) error) {
	ctx := r.Context()
	a, err := s.backend.Connect(ctx, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer a.Close()
	if err := fn(ctx, a); err != nil {
		s.writeError(w, r, err)
	}
}

func pathParam(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", fmt.Errorf("%w: path: the query parameter is required (an absolute path, or relative to the workdir)", sandbox.ErrInvalid)
	}
	return p, nil
}

func intParam(r *http.Request, name string) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s %q: want a non-negative integer", sandbox.ErrInvalid, name, v)
	}
	return n, nil
}

func boolParam(r *http.Request, name string) (bool, error) {
	switch v := r.URL.Query().Get(name); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, fmt.Errorf("%w: %s %q: allowed are true and false", sandbox.ErrInvalid, name, v)
	}
}

// readFile streams a file out. A failure after the first byte cuts the connection, so the
// caller sees a broken transfer rather than a short file that looks complete.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	p, err := pathParam(r)
	var off, n int64
	if err == nil {
		off, err = intParam(r, "offset")
	}
	if err == nil {
		n, err = intParam(r, "length")
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withAgent(w, r, func(ctx context.Context, a sandbox.Agent) error {
		rc, err := a.ReadFile(ctx, p, off, n)
		if err != nil {
			return err
		}
		defer rc.Close()
		w.Header().Set("Content-Type", api.ContentTypeBytes)
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, rc); err != nil {
			stateOf(ctx).log.Warn("file download cut", "path", p, "err", err)
			panic(http.ErrAbortHandler)
		}
		return nil
	})
}

// writeFile streams the body into a file, which the agent replaces atomically.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	p, err := pathParam(r)
	var mode uint64
	if v := r.URL.Query().Get("mode"); err == nil && v != "" {
		mode, err = strconv.ParseUint(v, 8, 32)
		if err != nil || mode > 0o7777 {
			err = fmt.Errorf("%w: mode %q: want octal permission bits, e.g. 0644", sandbox.ErrInvalid, v)
		}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withAgent(w, r, func(ctx context.Context, a sandbox.Agent) error {
		if err := a.WriteFile(ctx, p, r.Body, uint32(mode)); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	p, err := pathParam(r)
	var rec bool
	if err == nil {
		rec, err = boolParam(r, "recursive")
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withAgent(w, r, func(ctx context.Context, a sandbox.Agent) error {
		if err := a.Remove(ctx, p, rec); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withAgent(w, r, func(ctx context.Context, a sandbox.Agent) error {
		fi, err := a.Stat(ctx, p)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, fi)
		return nil
	})
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withAgent(w, r, func(ctx context.Context, a sandbox.Agent) error {
		fis, err := a.List(ctx, p)
		if err != nil {
			return err
		}
		if fis == nil {
			fis = []sandbox.FileInfo{}
		}
		writeJSON(w, http.StatusOK, api.FileList{Files: fis})
		return nil
	})
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req api.MkdirRequest
	if err := s.readJSON(r, &req, "mkdir request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Path == "" {
		s.writeError(w, r, fmt.Errorf("%w: path: required", sandbox.ErrInvalid))
		return
	}
	s.withAgent(w, r, func(ctx context.Context, a sandbox.Agent) error {
		if err := a.Mkdir(ctx, req.Path, req.Mode); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}
