package sessions

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// ProcStat is what liveness checks read of /proc/<pid>/stat.
type ProcStat struct {
	State byte   // field 3: R, S, D, Z, ...
	Start uint64 // field 22, starttime: with the pid, the process's identity
	// Exiting: the process is a zombie (state Z or X) or being torn down by the kernel
	// (flags, field 9, has PF_EXITING): it never runs its own code again.
	Exiting bool
}

// pfExiting is PF_EXITING (include/linux/sched.h), set at the start of do_exit.
const pfExiting = 0x4

// ParseStat reads a /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may itself hold spaces and parentheses: fields are counted after its last ')'.
func ParseStat(r io.Reader) (ProcStat, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && err != io.EOF {
		return ProcStat{}, err
	}
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return ProcStat{}, errors.New("stat: no ')' after the command name")
	}
	fields := strings.Fields(line[i+1:])
	// fields[0] is field 3 (state), fields[6] field 9 (flags), fields[19] field 22.
	if len(fields) < 20 {
		return ProcStat{}, fmt.Errorf("stat: %d fields after the command name, want at least 20", len(fields))
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return ProcStat{}, err
	}
	flags, err := strconv.ParseUint(fields[6], 10, 64)
	if err != nil {
		return ProcStat{}, err
	}
	exiting := fields[0] == "Z" || fields[0] == "X" || flags&pfExiting != 0
	return ProcStat{State: fields[0][0], Start: start, Exiting: exiting}, nil
}

// ReadStat reads /proc/<pid>/stat; fs.ErrNotExist when the process is gone.
func ReadStat(pid int) (ProcStat, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ProcStat{}, err
	}
	defer f.Close()
	return ParseStat(f)
}

// StartTime reads pid's start time; fs.ErrNotExist when the process is gone.
func StartTime(pid int) (uint64, error) {
	st, err := ReadStat(pid)
	return st.Start, err
}

// Running reports whether pid is still the process that started at start and not on its way
// out (ProcStat.Exiting): what an owner must be to still act on what it owns. Alive counts
// such a process until it is reaped.
func Running(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := ReadStat(pid)
	return err == nil && st.Start == start && !st.Exiting
}

// Alive reports whether pid is still the process that started at start. A zombie still
// counts: it is not yet reaped and its pid not yet reusable.
func Alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	got, err := StartTime(pid)
	return err == nil && got == start
}

// ProcAlive parses "<pid>-<start>" and reports whether that process still runs: one exiting
// or a zombie (Running) claims, fills and uses nothing more, so what it owns is up for reaping.
func ProcAlive(owner string) bool {
	pidS, startS, ok := strings.Cut(owner, "-")
	if !ok {
		return false
	}
	pid, err1 := strconv.Atoi(pidS)
	start, err2 := strconv.ParseUint(startS, 10, 64)
	return err1 == nil && err2 == nil && Running(pid, start)
}
