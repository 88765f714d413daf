// Package testbin builds the herald binary for the tests that run it as
// real processes (e2e, chaos): once per test binary, in TestMain.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Main builds ./cmd/herald (with the build tags given, e.g. "chaos") into
// a temporary folder, stores its path in *bin, runs the package's tests
// and exits with their code, removing the folder. A failed build exits 1
// with the compiler's output.
func Main(m *testing.M, bin *string, tags ...string) {
	dir, err := os.MkdirTemp("", "herald-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = filepath.Join(dir, "herald")
	args := []string{"build"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	build := exec.Command("go", append(args, "-o", *bin, "github.com/heraldmq/herald/cmd/herald")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building herald (tags %q): %v\n", tags, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Poll calls cond every interval until it returns nil, failing t with
// cond's last error once total has passed: the tests' way to wait for a
// condition instead of sleeping a fixed time.
func Poll(t testing.TB, total, every time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %v", total, what, err)
		}
		time.Sleep(every)
	}
}
