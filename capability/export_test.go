package capability

// CapableHostSet is the local set of a fully capable host, for the external tests.
func CapableHostSet() Set { return capableHost().Set() }
