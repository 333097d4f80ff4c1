package joinservice_test

import "os/exec"

func execOutput(bin string, args ...string) ([]byte, error) {
	return exec.Command(bin, args...).CombinedOutput()
}
