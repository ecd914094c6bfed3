package sbtypes

// EnvNamePattern is the grammar of environment variable names a sandbox takes: what a process
// environment carries unambiguously and a POSIX shell can name.
const EnvNamePattern = `^[A-Za-z_][A-Za-z0-9_]*$`

// IsEnvName reports whether s matches EnvNamePattern (a loop, not a regexp compiled at every
// agent start).
func IsEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}
