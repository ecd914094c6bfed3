package sessions

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// How runs and the filler of a key's parked sandboxes keep out of each other's way
// (docs/pool.md#refilling-parked-sandboxes-and-the-run): each claim stamps <key>.claimed, and a
// filler parks nothing while claims come closer together than ParkQuiet and some sandbox is
// still parked; a run whose key has a live filler (<key>.filler) starts no filler of its own
// but queues its used sandbox (<key>.used) and its miss (<key>.missed) for that one.

// ParkQuiet is how long after the last claim a filler waits before it parks again, while some
// sandbox is still parked: calls back to back come closer together than this, a caller
// thinking between calls does not.
const ParkQuiet = 100 * time.Millisecond

// StampClaim records a claim of key's parked sandboxes now (errors are ignored: it only
// delays a filler's refill by less).
func StampClaim(stateDir, key string) {
	p := IndexDir(stateDir, key) + ".claimed"
	now := time.Now()
	if err := os.Chtimes(p, now, now); errors.Is(err, fs.ErrNotExist) {
		if f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|syscall.O_CLOEXEC, 0o600); err == nil {
			f.Close()
		}
	}
}

// LastClaim is when key's parked sandboxes were last claimed (zero: never).
func LastClaim(stateDir, key string) time.Time {
	fi, err := os.Stat(IndexDir(stateDir, key) + ".claimed")
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// MarkFiller records this process as key's filler; the caller holds the key's lock.
func MarkFiller(stateDir, key string) error {
	self, err := SelfProc()
	if err != nil {
		return err
	}
	return os.WriteFile(IndexDir(stateDir, key)+".filler", []byte(self), 0o600)
}

// FillerAlive reports whether key's last filler is still running.
func FillerAlive(stateDir, key string) bool {
	data, err := os.ReadFile(IndexDir(stateDir, key) + ".filler")
	return err == nil && ProcAlive(strings.TrimSpace(string(data)))
}

// RecordMiss appends one miss of key (a run that found nothing parked, or took the last one),
// which the filler holding the key's lock reads (TakeMisses).
func RecordMiss(stateDir, key string) error {
	return appendTo(IndexDir(stateDir, key)+".missed", "m")
}

// TakeMisses returns how many misses were recorded since the last call and clears them
// (renamed first: a miss recorded meanwhile goes to the next call, or at worst is lost).
func TakeMisses(stateDir, key string) int {
	return len(take(IndexDir(stateDir, key) + ".missed"))
}

// QueueUsed hands used (or discarded) sandboxes of key, killed already, to its live filler to
// terminate (TakeUsed).
func QueueUsed(stateDir, key string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	return appendTo(IndexDir(stateDir, key)+".used", strings.Join(ids, "\n")+"\n")
}

// UsedPending reports whether used sandboxes wait in key's queue.
func UsedPending(stateDir, key string) bool {
	fi, err := os.Stat(IndexDir(stateDir, key) + ".used")
	return err == nil && fi.Size() > 0
}

// TakeUsed returns the queued used sandboxes of key and clears the queue.
func TakeUsed(stateDir, key string) []string {
	var ids []string
	for _, l := range strings.Split(take(IndexDir(stateDir, key)+".used"), "\n") {
		if statedir.CheckSessionID(l) == nil {
			ids = append(ids, l)
		}
	}
	return ids
}

// appendTo appends text to path in one write (O_APPEND: writers do not interleave).
func appendTo(path, text string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(text))
	return errors.Join(err, f.Close())
}

// take reads and removes path (renamed first, so a write meanwhile goes to a new file).
func take(path string) string {
	tmp := path + ".taking." + strconv.Itoa(os.Getpid())
	if err := os.Rename(path, tmp); err != nil {
		return ""
	}
	data, _ := os.ReadFile(tmp)
	_ = os.Remove(tmp)
	return string(data)
}
