package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

func TestFramesRoundTrip(t *testing.T) {
	var b bytes.Buffer
	b.Write(AppendOutput(nil, FrameStdout, 1, []byte("out")))
	b.Write(AppendOutput(nil, FrameStderr, 2, nil))
	if err := WriteJSONFrame(&b, FrameExit, Exit{ExitCode: 3, DurationMs: 7}); err != nil {
		t.Fatal(err)
	}
	want := []Frame{
		{Type: FrameStdout, Seq: 1, Payload: []byte("out")},
		{Type: FrameStderr, Seq: 2, Payload: []byte{}},
		{Type: FrameExit, Payload: []byte(`{"exitCode":3,"durationMs":7}`)},
	}
	var buf []byte
	for i, w := range want {
		f, nb, err := ReadFrame(&b, buf)
		buf = nb
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.Type != w.Type || f.Seq != w.Seq || !bytes.Equal(f.Payload, w.Payload) {
			t.Errorf("frame %d = %+v (%q), want %+v", i, f, f.Payload, w)
		}
	}
	if _, _, err := ReadFrame(&b, buf); err != io.EOF {
		t.Errorf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReadFrameRefusals(t *testing.T) {
	tests := map[string][]byte{
		"truncated header":        {1, 0, 0},
		"truncated payload":       {3, 0, 0, 0, 5, '{'},
		"oversized":               {3, 0x7f, 0, 0, 0},
		"unknown type":            {9, 0, 0, 0, 0},
		"output without sequence": {1, 0, 0, 0, 2, 'h', 'i'},
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			if _, _, err := ReadFrame(bytes.NewReader(in), nil); !errors.Is(err, ErrBadFrame) {
				t.Errorf("got %v, want ErrBadFrame", err)
			}
		})
	}
}

func TestCodeTable(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range sbtypes.Codes {
		code, status := CodeOf(fmt.Errorf("wrapped: %w", c.Class))
		if code != c.Code || status != c.Status {
			t.Errorf("%v -> %s %d, want %s %d", c.Class, code, status, c.Code, c.Status)
		}
		if !errors.Is(ErrorOf(code), c.Class) {
			t.Errorf("code %s maps back to %v, want %v", code, ErrorOf(code), c.Class)
		}
		if seen[code] {
			t.Errorf("code %s used twice", code)
		}
		seen[code] = true
	}
	for _, e := range []error{sbtypes.ErrNotFound, sbtypes.ErrUnsupported, sbtypes.ErrRefused, sbtypes.ErrDeadlineExceeded,
		sbtypes.ErrOutcomeUnknown, sbtypes.ErrUnreachable, sbtypes.ErrInvalid, sbtypes.ErrUnauthenticated,
		sbtypes.ErrForbidden, sbtypes.ErrConflict, sbtypes.ErrTooLarge} {
		if code, _ := CodeOf(e); code == CodeInternal {
			t.Errorf("sandbox class %v has no wire code", e)
		}
	}
	if code, status := CodeOf(errors.New("other")); code != CodeInternal || status != http.StatusInternalServerError {
		t.Errorf("unclassified error -> %s %d", code, status)
	}
	if ErrorOf("no-such-code") != nil {
		t.Error("unknown code maps to a class")
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(AppendOutput(nil, FrameStdout, 1, []byte("x")))
	f.Add([]byte{3, 0, 0, 0, 2, '{', '}'})
	f.Add([]byte{4, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		var buf []byte
		for {
			fr, nb, err := ReadFrame(r, buf)
			buf = nb
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrBadFrame) {
					t.Fatalf("unexpected error class %v", err)
				}
				return
			}
			if len(fr.Payload) > MaxFramePayload {
				t.Fatalf("payload %d bytes", len(fr.Payload))
			}
		}
	})
}
