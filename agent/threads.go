//go:build linux

package agent

import (
	"runtime"
	"sync"
)

// spareThreads makes the runtime start n OS threads now and leaves them idle for later: n
// goroutines each hold a thread (LockOSThread) until all n run at once, then let go. An
// unlocked thread whose goroutine ends parks on the runtime's idle list, and the runtime takes
// threads from that list before it creates one, so a blocking call later finds a thread even
// when the process limit no longer allows a new one.
func spareThreads(n int) {
	if n <= 0 {
		return
	}
	var started, release sync.WaitGroup
	started.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			started.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	started.Wait()
	release.Done()
	done.Wait()
}
