package mcp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// DefaultMaxMessageBytes bounds one inbound message on stdio (the go-sdk's own default line
// limit). A larger message is refused with an error answer to its request, and the server
// reads on: the SDK would end the connection, and with it every session of this server.
const DefaultMaxMessageBytes = 16 << 20

// DefaultOutputViewBytes is how much of each output stream a tool result keeps for a model's
// context by default (Options.OutputViewBytes).
const DefaultOutputViewBytes = 64 << 10

// lockedWriter is one Write at a time: the SDK writes each message with one Write, and the
// guard's refusals go between them, never inside one.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return nil }

// messageGuard passes newline-delimited messages of at most limit bytes through to the SDK and
// answers a longer one itself: it reads it to its end without keeping it, finds its top-level
// "id" on the way, and writes a JSON-RPC error for that id (null when it has none it could
// see). Nothing of a refused message reaches the SDK.
type messageGuard struct {
	r       *bufio.Reader
	closer  io.Closer
	w       io.Writer
	limit   int
	pending []byte
	err     error
}

func newMessageGuard(r io.ReadCloser, w io.Writer, limit int) *messageGuard {
	return &messageGuard{r: bufio.NewReaderSize(r, 64<<10), closer: r, w: w, limit: limit}
}

func (g *messageGuard) Close() error { return g.closer.Close() }

func (g *messageGuard) Read(p []byte) (int, error) {
	for len(g.pending) == 0 {
		if g.err != nil {
			return 0, g.err
		}
		g.pending, g.err = g.next()
	}
	n := copy(p, g.pending)
	g.pending = g.pending[n:]
	return n, nil
}

// next returns the next message of at most limit bytes (with its newline), refusing every
// longer one before it; an error comes with what was read before it.
func (g *messageGuard) next() ([]byte, error) {
	for {
		var line []byte
		for {
			chunk, err := g.r.ReadSlice('\n')
			line = append(line, chunk...)
			if len(line) > g.limit {
				if err := g.refuse(line, err); err != nil {
					return nil, err
				}
				line = nil
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			return line, err
		}
	}
}

// refuse reads the rest of an oversized message (begun with head; err is the last read's) and
// answers it with an error.
func (g *messageGuard) refuse(head []byte, err error) error {
	var sc idScanner
	sc.feed(head)
	size := int64(len(head))
	for errors.Is(err, bufio.ErrBufferFull) {
		var chunk []byte
		chunk, err = g.r.ReadSlice('\n')
		sc.feed(chunk)
		size += int64(len(chunk))
	}
	id := json.RawMessage("null")
	if sc.found && json.Valid(sc.val) {
		id = sc.val
	}
	msg, _ := json.Marshal(fmt.Sprintf("message of %d bytes or more is over this server's limit of %d bytes: send less in one call (a large file in parts, with sandbox_write_file)", size, g.limit))
	answer := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32600,"message":%s}}`+"\n", id, msg)
	if _, werr := g.w.Write([]byte(answer)); werr != nil {
		return werr
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return err // io.EOF ends the stream; nil reads on
}

// idScanner finds the value of a JSON object's top-level "id" in a stream of bytes without
// keeping the rest (an id is a number, a string or null: short; longer ones are not kept).
type idScanner struct {
	depth      int
	inStr, esc bool
	expectKey  bool
	inKey      bool
	key        []byte
	lastKey    string
	capturing  bool
	val        []byte
	found      bool
}

const maxIDBytes = 256

func (s *idScanner) feed(b []byte) {
	for i := 0; i < len(b); i++ {
		if s.found {
			return
		}
		c := b[i]
		if s.inStr && !s.esc && !s.inKey && !s.capturing && c != '"' && c != '\\' {
			// Inside a string nobody keeps (a program's code): skip to its next quote or escape.
			j := bytes.IndexAny(b[i:], "\"\\")
			if j < 0 {
				return
			}
			i += j
			c = b[i]
		}
		if s.inStr {
			switch {
			case s.inKey && len(s.key) < 8:
				s.key = append(s.key, c)
			case s.capturing && len(s.val) < maxIDBytes:
				s.val = append(s.val, c)
			}
			switch {
			case s.esc:
				s.esc = false
			case c == '\\':
				s.esc = true
			case c == '"':
				s.inStr = false
				if s.inKey {
					s.inKey = false
					s.lastKey = string(s.key[:max(len(s.key)-1, 0)])
				}
			}
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '"':
			s.inStr = true
			if s.depth == 1 && s.expectKey {
				s.inKey, s.expectKey, s.key = true, false, s.key[:0]
				continue
			}
		case '{', '[':
			s.depth++
			if s.depth == 1 && c == '{' {
				s.expectKey = true
			}
		case '}', ']':
			s.depth--
			if s.capturing && s.depth == 0 {
				s.capturing, s.found = false, true
				return
			}
		case ':':
			if s.depth == 1 && s.lastKey == "id" {
				s.capturing, s.val = true, s.val[:0]
				continue
			}
		case ',':
			if s.depth == 1 {
				if s.capturing {
					s.capturing, s.found = false, true
					return
				}
				s.expectKey = true
			}
		}
		if s.capturing && len(s.val) < maxIDBytes {
			s.val = append(s.val, c)
		}
	}
}
