package docker

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/sandbox"
)

const (
	masterFile = statedir.MasterFile
	lockFile   = statedir.LockFile
	configFile = "agent.json"
	runDir     = "run"
	rwDir      = "rw"
)

// The state dir's shared parts (ids, master secret, lock) are statedir's, as in backend/local.
var (
	newSessionID   = statedir.NewSessionID
	checkSessionID = statedir.CheckSessionID
	loadMaster     = statedir.LoadMaster
	flock          = statedir.Lock
	lockExclusive  = statedir.LockExclusive
	lockShared     = statedir.LockShared
)

// stateTag names a state dir in container labels, so that two backends over different state
// dirs never list, adopt or remove each other's containers.
func stateTag(stateDir string) string {
	h := sha256.Sum256([]byte(stateDir))
	return hex.EncodeToString(h[:8])
}

// makeScratch mounts the session's one tmpfs, sized to the disk limit, and makes in it the
// directories bound at the workdir (owned by the code's uid) and at /tmp (sticky, 1777): a
// write past the limit fails with ENOSPC wherever the code writes.
func makeScratch(dir string, diskBytes int64) (workspace, tmp string, err error) {
	rw := filepath.Join(dir, rwDir)
	if err := os.Mkdir(rw, 0o755); err != nil {
		return "", "", err
	}
	data := "size=" + strconv.FormatInt(diskBytes, 10) + ",mode=0755"
	if err := mountTmpfs(rw, data); err != nil {
		return "", "", err
	}
	workspace, tmp = filepath.Join(rw, "workspace"), filepath.Join(rw, "tmp")
	if err := os.Mkdir(workspace, 0o755); err != nil {
		return "", "", err
	}
	if err := os.Chown(workspace, CodeUID, CodeGID); err != nil {
		return "", "", err
	}
	if err := os.Mkdir(tmp, 0o777); err != nil {
		return "", "", err
	}
	if err := os.Chmod(tmp, 0o777|fs.ModeSticky); err != nil {
		return "", "", err
	}
	return workspace, tmp, nil
}

// removeSessionDir unmounts the scratch tmpfs and removes the session directory, confirming
// both are gone. An absent directory is not an error.
func removeSessionDir(dir string) error {
	if err := unmountScratch(filepath.Join(dir, rwDir)); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("session dir %s still exists", dir)
	}
	return nil
}

// resolveAgent finds the agent binary (statedir.ResolveAgent). It must be statically linked:
// it runs inside images whose libc we know nothing about.
func resolveAgent(opt string, args []string) (string, []string, error) {
	return statedir.ResolveAgent(opt, args, func(abs string, _ fs.FileInfo) error { return checkStatic(abs) })
}

// checkStatic refuses a dynamically linked ELF binary (one with a program interpreter).
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%w: agent binary %s is not an ELF executable: %v", sandbox.ErrInvalid, p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: agent binary %s is dynamically linked; it runs inside arbitrary images, build it static: CGO_ENABLED=0 go build ./cmd/airlock-agent", sandbox.ErrInvalid, p)
		}
	}
	return nil
}

// makeFreezer creates a session's freezer cgroup. Only the freezer hierarchy is delegated:
// the agent moves each exec there to kill it as a whole, while memory, pids and cpu stay the
// container's own. Creating a v1 cgroup is a mkdir; there is nothing to configure in it.
func makeFreezer(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("freezer cgroup parent: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("freezer cgroup: %w", err)
	}
	return nil
}
