// Package setting names where the platform setting is read from and tells whether it can only mean the local runtime, with the standard library only: platform and the lean front read it.
package setting

import "os"

// Where the platform setting is read from, after the --platform flag.
const (
	// EnvPlatform overrides the config file's platform.
	EnvPlatform = "AIRLOCK_PLATFORM"
	// EnvConfig names the config file (which must then exist).
	EnvConfig = "AIRLOCK_CONFIG"
	// DefaultConfigFile is read when $AIRLOCK_CONFIG is unset and it exists.
	DefaultConfigFile = "/etc/airlock/config.yaml"
)

// LocalOnly reports whether the platform settings can only mean the local runtime or auto:
// flag is --platform's value (flagSet: given), else $AIRLOCK_PLATFORM counts. A config file
// makes it false: its platform, and whether it is valid, are for whoever reads YAML.
func LocalOnly(flag string, flagSet bool) bool {
	if p := os.Getenv(EnvConfig); p != "" {
		return false
	}
	if _, err := os.Stat(DefaultConfigFile); err == nil {
		return false
	}
	v := flag
	if !flagSet {
		v = os.Getenv(EnvPlatform)
	}
	return v == "" || v == "auto" || v == "local"
}
