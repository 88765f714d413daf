package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// ownMount matches the tmpfs mount points this package makes; the hex
// number is the creating process's pid.
var ownMount = regexp.MustCompile(`/disk-hx([0-9a-f]+)$`)

// diskDirName is the name of a node's tmpfs mount point.
func diskDirName() string { return fmt.Sprintf("disk-hx%x", os.Getpid()) }

// mountTmpfs mounts a tmpfs of size bytes at dir, creating dir.
func mountTmpfs(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		return unsupported("cannot mount a tmpfs at %s: %v: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unmount unmounts dir, lazily if it is busy.
func unmount(dir string) error {
	if err := exec.Command("umount", dir).Run(); err == nil {
		return nil
	}
	if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("umount %s: %v: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sweepMounts unmounts the tmpfs data dirs of this package whose creating
// process is gone: they hold memory until unmounted.
func sweepMounts() {
	raw, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "tmpfs" {
			continue
		}
		m := ownMount.FindStringSubmatch(f[1])
		if m == nil {
			continue
		}
		pid, err := strconv.ParseInt(m[1], 16, 64)
		if err != nil || int(pid) == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			unmount(f[1])
		}
	}
}
