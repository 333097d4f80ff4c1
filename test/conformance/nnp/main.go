// Command nnp stands in for the program of the conformance suite's nonewprivs image (upstream's
// nnp.c). Installed set-user-ID root, it prints its effective user ID: 0 when the kernel honoured
// the set-user-ID bit, the caller's when the container runs with no_new_privs
// (allowPrivilegeEscalation: false). The suite reads that line.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}
