package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// quickStartCommands returns the client commands of README.md's quick
// start: the lines of the second shell block of "## Quick start (5
// minutes)" (the first builds the binary and starts the broker).
func quickStartCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n## Quick start (5 minutes)\n")
	if i < 0 {
		t.Fatal("README.md has no quick start")
	}
	s = s[i:]
	if j := strings.Index(s[1:], "\n## "); j >= 0 {
		s = s[:j+1]
	}
	blocks := strings.Split(s, "```sh\n")
	if len(blocks) < 3 {
		t.Fatalf("the quick start has %d shell blocks, want 2", len(blocks)-1)
	}
	var cmds []string
	for _, line := range strings.Split(blocks[2][:strings.Index(blocks[2], "```")], "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmds = append(cmds, line)
	}
	return cmds
}

// TestReadmeQuickStart runs every client command of README.md's quick
// start, as written, against a real broker: each must exit 0, so the front
// door cannot drift from the CLI.
func TestReadmeQuickStart(t *testing.T) {
	cmds := quickStartCommands(t)
	if len(cmds) < 5 {
		t.Fatalf("only %d quick-start commands found: %q", len(cmds), cmds)
	}
	n := startProc(t, t.TempDir())
	dir := t.TempDir()
	if err := os.Symlink(heraldBin, dir+"/herald"); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if !strings.Contains(c, "./herald ") {
			t.Fatalf("quick-start line %q does not run ./herald", c)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, "bash", "-c", "set -o pipefail; "+c)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "HERALD_ADDR="+n.Addr())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("quick start: %s: %v after %v\n%s", c, err, time.Since(start).Round(time.Millisecond), out.String())
		}
		switch {
		case strings.Contains(c, "consume --topic reminders"):
			if !strings.Contains(out.String(), "call mom") {
				t.Fatalf("quick start: %s printed %q, want the delayed message", c, out.String())
			}
		case strings.Contains(c, "consume --topic orders --from earliest --max 5"):
			if lines := strings.Count(out.String(), "\n"); lines != 5 {
				t.Fatalf("quick start: %s printed %d lines, want 5:\n%s", c, lines, out.String())
			}
		}
		t.Logf("%s: ok in %v", c, time.Since(start).Round(time.Millisecond))
	}
}
