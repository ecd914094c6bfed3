package agent

// SetSpawnerLauncher replaces how the spawner loop goroutine is started and returns the
// restore function. Tests use it to start the loop on the main thread.
func SetSpawnerLauncher(launch func(loop func())) (restore func()) {
	old := goSpawner
	goSpawner = launch
	return func() { goSpawner = old }
}
