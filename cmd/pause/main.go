// Command pause is the sandbox process of every pod (the image registry.k8s.io/pause of the local
// provider): it holds the pod's namespaces, reaps the zombies re-parented to it as PID 1 of the
// pod's PID namespace, and exits 0 on SIGINT or SIGTERM, as upstream's pause.c does.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is the upstream pause version this program stands in for.
const version = "3.10.1"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Printf("pause.go %s\n", version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	reap() // children that exited before Notify
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
		os.Exit(0)
	}
}

// reap waits for every child that has exited, without blocking. SIGCHLD signals coalesce, so
// one signal may stand for several children.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
