//go:build linux

package sessions

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// A host-image sandbox binds a copy of chosen host /etc entries that backend/local makes once
// under the state dir and rebuilds as soon as a source changes (backend/local/etc.go). This is
// the read side: the manifest a copy was made from and the check that it is still the host's,
// which a claimer makes without building anything.

// EtcCacheDir is the state dir's subdirectory that holds the copies; session ids never clash
// with it (statedir.CheckSessionID).
const EtcCacheDir = "etc"

// DefaultWorkdir is spec.DefaultWorkdir (a test in backend/local keeps them equal): a record's
// spec leaves the workdir empty for it.
const DefaultWorkdir = "/workspace"

// hostEtc are the host /etc entries a host-image sandbox sees, read-only: what dynamic linking,
// TLS roots, time zones, python3, node and bash read. Never the whole of /etc (shadow, machine
// secrets, package-manager credentials in pip.conf or npmrc).
var hostEtc = []string{
	"alternatives", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf",
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
	"protocols", "services", "ethertypes", "rpc", "networks", "gai.conf", "host.conf",
	"mime.types", "magic", "magic.mime", "locale.alias",
	"bash.bashrc", "profile", "inputrc", "debian_version", "os-release", "lsb-release",
	"python3", "perl",
}

// HostEtc lists the host /etc entries (relative to /etc) a host-image sandbox sees.
func HostEtc() []string {
	names := append([]string(nil), hostEtc...)
	// python3.X keeps sitecustomize in /etc/python3.X.
	matches, _ := filepath.Glob("/etc/python3.*")
	for _, m := range matches {
		names = append(names, filepath.Base(m))
	}
	return names
}

// EtcManifest is what a copy was made from.
type EtcManifest struct {
	Workdir string `json:"workdir"`
	// Dir is the copy's name under the cache dir.
	Dir string `json:"dir"`
	// Names are HostEtc() at build time: a new /etc/python3.X is a change too.
	Names []string `json:"names"`
	// Sources are the host paths compared on each use, with their identity at build time.
	Sources []EtcSource `json:"sources"`
}

// EtcSource is one host path a copy was made from.
type EtcSource struct {
	Path string `json:"path"`
	ID   string `json:"id"` // "" when the path did not exist
}

// ShortHash names a thing by a short hash of s (a workdir's manifest, a state dir's cgroup).
func ShortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:6])
}

// EtcManifestPath is the manifest of workdir's copy in cacheDir (<state>/EtcCacheDir).
func EtcManifestPath(cacheDir, workdir string) string {
	return filepath.Join(cacheDir, "manifest-"+ShortHash(workdir)+".json")
}

// ReadEtcManifest reads workdir's manifest in cacheDir; nil when there is none or it is not
// one for workdir.
func ReadEtcManifest(cacheDir, workdir string) *EtcManifest {
	b, err := os.ReadFile(EtcManifestPath(cacheDir, workdir))
	if err != nil {
		return nil
	}
	var m EtcManifest
	if json.Unmarshal(b, &m) != nil || m.Workdir != workdir || m.Dir == "" || filepath.Base(m.Dir) != m.Dir {
		return nil
	}
	return &m
}

// Fresh reports whether every source is still what the copy was made from.
func (m *EtcManifest) Fresh(workdir string, names []string) bool {
	if m.Workdir != workdir || !slices.Equal(m.Names, names) {
		return false
	}
	var buf []byte
	for _, s := range m.Sources {
		buf = AppendSourceID(buf[:0], s.Path)
		if string(buf) != s.ID {
			return false
		}
	}
	return true
}

// SourceID identifies a path's current content well enough to notice any change to it.
func SourceID(p string) string { return string(AppendSourceID(nil, p)) }

// AppendSourceID appends SourceID(p) to b (nothing when p cannot be read): every create
// compares ~45 of them, without a string allocated for each.
func AppendSourceID(b []byte, p string) []byte {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return b
	}
	// dev:ino:mode(octal):size:mtime.sec.nsec:ctime
	b = strconv.AppendUint(b, st.Dev, 10)
	b = append(b, ':')
	b = strconv.AppendUint(b, st.Ino, 10)
	b = append(b, ':')
	b = strconv.AppendUint(b, uint64(st.Mode), 8)
	b = append(b, ':')
	b = strconv.AppendInt(b, st.Size, 10)
	for _, t := range []unix.Timespec{st.Mtim, st.Ctim} {
		b = append(b, ':')
		b = strconv.AppendInt(b, t.Sec, 10)
		b = append(b, '.')
		b = strconv.AppendInt(b, t.Nsec, 10)
	}
	return b
}

// EtcCurrent refuses a host-image sandbox made ahead (a parked sandbox) whose /etc copy is no longer
// the host's: a sandbox created now would get a new copy, and one handed out must not show
// older files than that. Unlike backend/local's check it never builds a copy: a stale parked sandbox is
// discarded, and the next filler builds the new copy as it makes the next one.
func EtcCurrent(stateDir string, rec *Record) error {
	if rec.EtcDir == "" {
		return nil
	}
	workdir := rec.Spec.Workdir
	if workdir == "" {
		workdir = DefaultWorkdir
	}
	m := ReadEtcManifest(filepath.Join(stateDir, EtcCacheDir), workdir)
	switch {
	case m == nil:
		return fmt.Errorf("its /etc copy %s: no manifest for workdir %s", rec.EtcDir, workdir)
	case m.Dir != rec.EtcDir:
		return fmt.Errorf("its /etc copy %s is stale (now %s)", rec.EtcDir, m.Dir)
	case !m.Fresh(workdir, HostEtc()):
		return fmt.Errorf("its /etc copy %s is stale (the host's /etc changed since)", rec.EtcDir)
	}
	return nil
}
