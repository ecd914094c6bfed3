package docker

import "testing"

// TestRemovalInProgress: of the engines' refusals to remove a container (the API's 409
// messages, the CLIs' stderr), only the one for a removal already under way is taken for it.
func TestRemovalInProgress(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{"Error response from daemon: removal of container 3f2a is already in progress", true},
		{"Error: removal of container 3f2a is already in progress", true},
		{`Conflict. The container name "/airlock-s-1" is already in use by container "3f2a"`, false},
		{"You cannot remove a running container 3f2a. Stop the container before attempting removal or force remove", false},
		{"", false},
	} {
		if got := removalInProgress(tc.msg); got != tc.want {
			t.Errorf("removalInProgress(%q) = %v, want %v", tc.msg, got, tc.want)
		}
	}
}
