// pause holds a pod sandbox's namespaces open, as the node's sandbox image must: it waits for
// SIGINT or SIGTERM and exits 0, and reaps any child handed to it (it runs as PID 1 when the
// pod shares its process namespace). Built static, it is the whole of kvgate's local sandbox
// image, so a node without a registry needs no pulled pause image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
