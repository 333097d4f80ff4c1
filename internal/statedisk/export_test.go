package statedisk

import (
	"io"
	"os/exec"
)

// LUKS2System replaces what a LUKS2 drives on the machine, so that tests on a kernel
// without device-mapper can run everything but the mapping itself for real.
type LUKS2System struct {
	Run         func(cmd *exec.Cmd) error
	Mount       func(source, target string) error
	Unmount     func(target string) error
	Mounted     func(path string) (bool, error)
	MapperDir   string
	CheckHeader func(r io.ReaderAt) (*LUKS2Header, error)
}

// SetLUKS2System makes l use s; nil fields keep the real behaviour.
func SetLUKS2System(l *LUKS2, s LUKS2System) {
	sys := realLUKS2System
	if s.Run != nil {
		sys.run = s.Run
	}
	if s.Mount != nil {
		sys.mount = func(source, target string, _ uintptr) error { return s.Mount(source, target) }
	}
	if s.Unmount != nil {
		sys.unmount = s.Unmount
	}
	if s.Mounted != nil {
		sys.mounted = s.Mounted
	}
	if s.MapperDir != "" {
		sys.mapperDir = s.MapperDir
	}
	if s.CheckHeader != nil {
		sys.checkHeader = s.CheckHeader
	}
	l.sys = &sys
}
