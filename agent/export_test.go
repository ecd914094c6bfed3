package agent

import "os"

// SetSpawnerLauncher replaces how the spawner loop goroutine is started and returns the
// restore function. Tests use it to start the loop on the main thread.
func SetSpawnerLauncher(launch func(loop func())) (restore func()) {
	old := goSpawner
	goSpawner = launch
	return func() { goSpawner = old }
}

// SetMkdirHook sets a function run right after the files API made a directory and before it
// opens it; it returns the restore function.
func SetMkdirHook(hook func(parent *os.Root, name string)) (restore func()) {
	old := testHookMkdir
	testHookMkdir = hook
	return func() { testHookMkdir = old }
}

// SetFreezeHook sets a function run before each freeze of an exec cgroup and sets the number of
// rounds a v1 kill makes without freezing (v1UnfrozenRounds); it returns the restore function.
func SetFreezeHook(hook func(dir string), unfrozenRounds int) (restore func()) {
	oldHook, oldRounds := testHookFreeze, v1UnfrozenRounds
	testHookFreeze, v1UnfrozenRounds = hook, unfrozenRounds
	return func() { testHookFreeze, v1UnfrozenRounds = oldHook, oldRounds }
}

// V1UnfrozenRounds is the default number of rounds a v1 kill makes without freezing.
const V1UnfrozenRounds = v1UnfrozenRoundsDefault

// DisableReaper keeps the process group as the kill scope where there is no cgroup, as an
// agent where the subreaper is not available; it returns the restore function.
func DisableReaper() (restore func()) {
	old := noReaper
	noReaper = true
	return func() { noReaper = old }
}
