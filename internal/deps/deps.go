//go:build tools

// Package deps pins the libraries DESIGN.md names until code imports them; remove lines as they get real users.
package deps

import (
	_ "github.com/containerd/cgroups/v3/cgroup1"
	_ "github.com/containerd/cgroups/v3/cgroup2"
	_ "github.com/creack/pty"
	_ "github.com/elastic/go-seccomp-bpf"
	_ "github.com/google/go-containerregistry/pkg/v1/layout"
	_ "github.com/google/go-containerregistry/pkg/v1/mutate"
	_ "github.com/google/go-containerregistry/pkg/v1/remote"
	_ "github.com/google/go-containerregistry/pkg/v1/tarball"
	_ "github.com/google/nftables"
	_ "github.com/invopop/jsonschema"
	_ "github.com/landlock-lsm/go-landlock/landlock"
	_ "github.com/moby/profiles/seccomp"
	_ "github.com/modelcontextprotocol/go-sdk/mcp"
	_ "github.com/opencontainers/runtime-spec/specs-go"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "github.com/vishvananda/netlink"
	_ "github.com/vishvananda/netns"
	_ "go.uber.org/goleak"
	_ "golang.org/x/sys/unix"
	_ "k8s.io/apimachinery/pkg/api/resource"
	_ "sigs.k8s.io/yaml"
)
