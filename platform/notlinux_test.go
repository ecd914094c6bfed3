package platform

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestLocalOffLinux: with the local runtime's opener as it is built off Linux, --platform local
// is refused naming the system and the platforms that run there; capabilities still answer
// with the local set and say why it cannot start; auto passes it over for docker.
func TestLocalOffLinux(t *testing.T) {
	offLinux := func(context.Context, Config) (Backend, string, error) { return nil, "", ErrLocalNeedsLinux() }
	o := openers{local: offLinux, docker: func(context.Context, Config) (Backend, string, error) {
		return fake(t), "docker CLI (/usr/local/bin/docker)", nil
	}}
	want := []string{"the local runtime needs Linux and this host runs " + runtime.GOOS, "use --platform docker|kubernetes|aws|azure|gcp"}

	_, _, err := o.open(t.Context(), Config{Platform: string(capability.Local)})
	if !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("--platform local: %v, want ErrUnsupported", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("--platform local: %q does not say %q", err, w)
		}
	}

	set, src, err := o.capabilities(t.Context(), Config{Platform: string(capability.Local)})
	if err != nil || set.Platform != capability.Local || src.Instance {
		t.Fatalf("capabilities --platform local: %v, %+v; want the probed local set", err, src)
	}
	for _, w := range append(want, "the local runtime cannot start here") {
		if !strings.Contains(src.Text, w) {
			t.Errorf("capabilities --platform local: %q does not say %q", src.Text, w)
		}
	}

	b, ch, err := o.open(t.Context(), Config{Platform: Auto})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ch.Platform != capability.Docker || !strings.Contains(ch.Notice(), fmt.Sprintf("needs Linux and this host runs %s", runtime.GOOS)) {
		t.Errorf("auto: %s, notice %q; want docker, saying why not local", ch.Platform, ch.Notice())
	}
}
