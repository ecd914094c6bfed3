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
