package local

// idBaseOf is the host id rec's sandbox id 0 maps to.
func (b *Backend) idBaseOf(rec *record) int {
	if rec.IDBase != 0 {
		return rec.IDBase
	}
	return b.opts.UIDBase // gVisor's, and records from before per-sandbox ranges
}

// releaseIDs frees the id range of session id once nothing of it runs any more.
func (b *Backend) releaseIDs(id string, rec *record) error {
	switch {
	case rec == nil:
		return b.ids.ReleaseAll(id) // a create that died before its record
	case rec.IDBase != 0:
		return b.ids.Release(rec.IDRange, id)
	}
	return nil
}
