package spec

// Defaults applied by ApplyDefaults to fields left unset. The image has no default: a sandbox
// must say where its root filesystem comes from.
const (
	DefaultCPU                Quantity   = "1"
	DefaultMemory             Quantity   = "512Mi"
	DefaultDisk               Quantity   = "1Gi"
	DefaultMaxProcesses       int64      = 256
	DefaultEgressMode         EgressMode = EgressDeny
	DefaultMaxLifetimeSeconds int64      = 3600
	DefaultIdleTimeoutSeconds int64      = 600
	DefaultReconnect                     = true
	DefaultRuntime            Runtime    = RuntimeNative
	DefaultWorkdir                       = "/workspace"
)

// Minimums below which a sandbox cannot start a process at all; validation refuses smaller values.
const (
	MinMemoryBytes int64 = 1 << 20 // 1Mi
	MinDiskBytes   int64 = 1 << 20 // 1Mi
)

// ApplyDefaults fills every unset field with its default and leaves set fields alone, valid or not.
// The idle timeout defaults to DefaultIdleTimeoutSeconds, or to the lifetime when that is shorter,
// so that declaring only a short lifetime stays valid.
func (s *Sandbox) ApplyDefaults() {
	l := &s.Limits
	if l.CPU == "" {
		l.CPU = DefaultCPU
	}
	if l.Memory == "" {
		l.Memory = DefaultMemory
	}
	if l.Disk == "" {
		l.Disk = DefaultDisk
	}
	if l.MaxProcesses == nil {
		l.MaxProcesses = ptr(DefaultMaxProcesses)
	}
	if s.Egress.Mode == "" {
		s.Egress.Mode = DefaultEgressMode
	}
	se := &s.Session
	if se.MaxLifetimeSeconds == nil {
		se.MaxLifetimeSeconds = ptr(DefaultMaxLifetimeSeconds)
	}
	if se.IdleTimeoutSeconds == nil {
		se.IdleTimeoutSeconds = ptr(defaultIdle(*se.MaxLifetimeSeconds))
	}
	if se.Reconnect == nil {
		se.Reconnect = ptr(DefaultReconnect)
	}
	if s.Workdir == "" {
		s.Workdir = DefaultWorkdir
	}
	if s.Runtime == "" {
		s.Runtime = DefaultRuntime
	}
}

// ApplyDefaults sets Kind to "Stack" when empty and applies the sandbox defaults to every
// sandbox. The apiVersion is never defaulted: a file must say which version it is written for.
func (st *Stack) ApplyDefaults() {
	if st.Kind == "" {
		st.Kind = StackKind
	}
	for i := range st.Sandboxes {
		st.Sandboxes[i].ApplyDefaults()
	}
}

// Lifetime is the session's maximum lifetime in seconds; an unset value is the default.
func (se Session) Lifetime() int64 {
	if se.MaxLifetimeSeconds == nil {
		return DefaultMaxLifetimeSeconds
	}
	return *se.MaxLifetimeSeconds
}

// IdleTimeout is the session's idle timeout in seconds; an unset value is the default.
func (se Session) IdleTimeout() int64 {
	if se.IdleTimeoutSeconds == nil {
		return defaultIdle(se.Lifetime())
	}
	return *se.IdleTimeoutSeconds
}

// CanReconnect reports whether callers may reattach; an unset value is the default.
func (se Session) CanReconnect() bool {
	if se.Reconnect == nil {
		return DefaultReconnect
	}
	return *se.Reconnect
}

func defaultIdle(lifetime int64) int64 {
	// A non-positive lifetime is refused by validation; keep the plain default so the idle
	// timeout does not collect a second, derived error.
	if lifetime > 0 && lifetime < DefaultIdleTimeoutSeconds {
		return lifetime
	}
	return DefaultIdleTimeoutSeconds
}

func ptr[T any](v T) *T { return &v }
