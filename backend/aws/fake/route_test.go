package fake

import "testing"

// TestOperation: each route names its operation; a wrong method, HEAD, an unknown or partial
// path names none (the caller answers UnknownOperationException).
func TestOperation(t *testing.T) {
	for _, c := range []struct{ method, rest, want string }{
		{"POST", "microvms", "RunMicrovm"},
		{"GET", "microvms", "ListMicrovms"},
		{"GET", "microvms/mvm-1", "GetMicrovm"},
		{"DELETE", "microvms/mvm-1", "TerminateMicrovm"},
		{"POST", "microvms/mvm-1/suspend", "SuspendMicrovm"},
		{"POST", "microvms/mvm-1/resume", "ResumeMicrovm"},
		{"POST", "microvms/mvm-1/auth-token", "CreateMicrovmAuthToken"},
		{"POST", "microvm-images", "CreateMicrovmImage"},
		{"PUT", "microvm-images/img", "UpdateMicrovmImage"},
		{"GET", "microvm-images/img", "GetMicrovmImage"},
		{"GET", "microvm-images/img/versions/1.0", "GetMicrovmImageVersion"},
		{"GET", "microvm-images/img/versions/1.0/builds", "ListMicrovmImageBuilds"},
		{"PUT", "microvms", ""},
		{"HEAD", "microvms", ""},
		{"POST", "microvms/mvm-1/reboot", ""},
		{"GET", "microvm-images/img/versions", ""},
		{"GET", "nothing", ""},
	} {
		if got := operation(c.method, c.rest); got != c.want {
			t.Errorf("operation(%s, %q) = %q, want %q", c.method, c.rest, got, c.want)
		}
	}
}
