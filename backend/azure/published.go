package azure

import "github.com/airlock-sandbox/airlock/capability"

// Published is this backend's set, the same wherever it runs (capability.For(capability.Azure),
// whose reasons say what the data plane lacks or what is not known on its wire).
func Published() capability.Set {
	s, err := capability.For(capability.Azure)
	if err != nil {
		panic(err) // azure is one of capability.Platforms
	}
	return s
}
