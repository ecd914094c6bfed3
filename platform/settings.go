package platform

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// Where the platform setting is read from, after the --platform flag.
const (
	// EnvPlatform overrides the config file's platform.
	EnvPlatform = "AIRLOCK_PLATFORM"
	// EnvConfig names the config file (which must then exist).
	EnvConfig = "AIRLOCK_CONFIG"
	// DefaultConfigFile is read when $AIRLOCK_CONFIG is unset and it exists.
	DefaultConfigFile = "/etc/airlock/config.yaml"
)

// File is the config file: the platform and how to reach each one.
type File struct {
	Platform   string           `json:"platform,omitempty"`
	Docker     DockerConfig     `json:"docker,omitempty"`
	Kubernetes KubernetesConfig `json:"kubernetes,omitempty"`
	AWS        AWSConfig        `json:"aws,omitempty"`
	Gcp        GcpConfig        `json:"gcp,omitempty"`
	Azure      AzureConfig      `json:"azure,omitempty"`
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
