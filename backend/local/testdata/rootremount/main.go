// Command rootremount is what a sandbox's root would try against the image's read-only mount:
// it is run inside a sandbox's namespaces (TestOCIImageOwnership), never in one by the runtime.
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Arguments are pairs MOUNT FILE: clear MOUNT's read-only flag with mount_setattr, remount
// it read-write, then write FILE. One line per attempt: "<what> <path>: ok" or the error.
func main() {
	args := os.Args[1:]
	for i := 0; i+1 < len(args); i += 2 {
		mnt, file := args[i], args[i+1]
		report := func(what, p string, err error) {
			if err == nil {
				fmt.Printf("%s %s: ok\n", what, p)
			} else {
				fmt.Printf("%s %s: %v\n", what, p, err)
			}
		}
		report("setattr-rw", mnt, unix.MountSetattr(-1, mnt, 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}))
		report("remount-rw", mnt, unix.Mount("", mnt, "", unix.MS_REMOUNT|unix.MS_BIND, ""))
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
		if err == nil {
			_, err = f.WriteString("written by the sandbox's root\n")
			f.Close()
		}
		report("write", file, err)
	}
}
