package platform

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/egress"
	"github.com/airlock-sandbox/airlock/platform/setting"
	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Where the platform setting is read from, after the --platform flag.
const (
	EnvPlatform       = setting.EnvPlatform
	EnvConfig         = setting.EnvConfig
	DefaultConfigFile = setting.DefaultConfigFile
	// EnvEgressPublic lists documentation prefixes (TEST-NET-1/2/3, 2001:db8::/32, 3fff::/20, or
	// parts of them), comma-separated, that the local runtime's egress treats as public: a lab whose
	// "internet" lives there proves allowDomains' allowed path (and its SNI, Host and
	// rebinding checks) end to end. Any other prefix is refused (docs/egress.md).
	EnvEgressPublic = "AIRLOCK_EGRESS_PUBLIC"
)

// EgressPublic parses $AIRLOCK_EGRESS_PUBLIC (nil when unset); the local runtime refuses a
// prefix outside the documentation ranges, naming it.
func EgressPublic() ([]netip.Prefix, error) {
	v := strings.TrimSpace(os.Getenv(EnvEgressPublic))
	if v == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for _, f := range strings.Split(v, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%w: $%s: %q is not a prefix such as 198.51.100.0/24: %v", sandbox.ErrInvalid, EnvEgressPublic, strings.TrimSpace(f), err)
		}
		if !egress.DocumentationPrefix(p) {
			return nil, fmt.Errorf("%w: $%s: %s is not inside a documentation range (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20): only those may be declared public, for a lab's fake internet", sandbox.ErrInvalid, EnvEgressPublic, p)
		}
		out = append(out, p)
	}
	return out, nil
}

// File is the config file: the platform and how to reach each one.
type File struct {
	Platform   string           `json:"platform,omitempty"`
	Docker     DockerConfig     `json:"docker,omitempty"`
	Kubernetes KubernetesConfig `json:"kubernetes,omitempty"`
	AWS        AWSConfig        `json:"aws,omitempty"`
	Gcp        GcpConfig        `json:"gcp,omitempty"`
	Azure      AzureConfig      `json:"azure,omitempty"`
	Pool       PoolConfig       `json:"pool,omitempty"`
}

// PoolConfig is the config file's pool section: what the local runtime's pools (airlock run's
// parked sandboxes, the MCP server's process pool) may hold.
type PoolConfig struct {
	// Memory is the pool memory (docs/pool.md#the-pool-memory), e.g. 256Mi.
	Memory string `json:"memory,omitempty"`
}

// PoolMemory is the pool memory in bytes and where it came from: the flag (flagSet: --pool-memory
// was given), else $AIRLOCK_POOL_MEMORY, else pool.memory in the config file, else
// core.PoolMemoryDefault. A bad value is refused naming where it came from.
func PoolMemory(flag string, flagSet bool) (int64, string, error) {
	v, from := core.PoolMemoryDefault, "the default"
	if flagSet {
		v, from = flag, "--"+core.PoolMemoryFlag
	} else if env, ok := os.LookupEnv(core.EnvPoolMemory); ok {
		v, from = env, "$"+core.EnvPoolMemory
	} else {
		path, must := ConfigPath()
		f, err := LoadFile(path, must)
		if err != nil {
			return 0, "", err
		}
		if f.Pool.Memory != "" {
			v, from = f.Pool.Memory, "pool.memory in "+path
		}
	}
	n, err := core.ParsePoolMemory(v)
	if err != nil {
		return 0, from, fmt.Errorf("%s: %w", from, err)
	}
	return n, from, nil
}

// ConfigPath is the config file to read: $AIRLOCK_CONFIG, else DefaultConfigFile; must says
// whether it has to exist ($AIRLOCK_CONFIG names one).
func ConfigPath() (path string, must bool) {
	if p := os.Getenv(EnvConfig); p != "" {
		return p, true
	}
	return DefaultConfigFile, false
}

// LoadFile reads the config file at path; a missing file is a zero File unless must. Unknown
// fields are refused, naming them.
func LoadFile(path string, must bool) (File, error) {
	var f File
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !must:
		return f, nil
	case err != nil:
		return f, fmt.Errorf("%w: config file: %v", sandbox.ErrInvalid, err)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, fmt.Errorf("%w: config file %s: %v", sandbox.ErrInvalid, path, err)
	}
	if _, err := Parse(f.Platform, path); err != nil {
		return f, err
	}
	return f, nil
}

// Settings is the Config the flag, the environment and the config file give, in that order of
// precedence for the platform (flagSet: --platform was given); the file's docker and
// kubernetes (and aws) settings apply whichever platform is chosen.
func Settings(flag string, flagSet bool) (Config, error) {
	path, must := ConfigPath()
	f, err := LoadFile(path, must)
	if err != nil {
		return Config{}, err
	}
	c := Config{Docker: f.Docker, Kubernetes: f.Kubernetes, AWS: f.AWS, Gcp: f.Gcp, Azure: f.Azure}
	env, envSet := os.LookupEnv(EnvPlatform)
	switch {
	case flagSet:
		c.Platform, c.From = flag, "--platform"
	case envSet && env != "":
		c.Platform, c.From = env, "$"+EnvPlatform
	case f.Platform != "":
		c.Platform, c.From = f.Platform, path
	default:
		c.Platform, c.From = Auto, "the default"
	}
	if c.Platform, err = Parse(c.Platform, c.From); err != nil {
		return Config{}, err
	}
	return c, nil
}
