package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
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

// docBlock is one fenced block of a Markdown page: its info string ("sh",
// "go", "" for an output) and its lines.
type docBlock struct {
	lang  string
	line  int // of the opening fence, 1-based
	lines []string
}

// fencedBlocks returns the fenced blocks of a Markdown page, in order.
func fencedBlocks(t *testing.T, page string) []docBlock {
	t.Helper()
	var blocks []docBlock
	var cur *docBlock
	for i, l := range strings.Split(page, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &docBlock{lang: strings.TrimSpace(l[3:]), line: i + 1}
		case cur != nil && strings.TrimSpace(l) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	if cur != nil {
		t.Fatalf("the fence opened at line %d is never closed", cur.line)
	}
	return blocks
}

// outputLine turns a line of a page's output block into a regexp: "..."
// stands for any text (what changes from run to run), a run of spaces or
// tabs for any such run (table columns widen with what they hold), and the
// rest is literal.
func outputLine(want string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	s := strings.TrimRight(want, " \t")
	for len(s) > 0 {
		switch {
		case strings.HasPrefix(s, "..."):
			b.WriteString(".*")
			s = s[3:]
		case s[0] == ' ' || s[0] == '\t':
			b.WriteString(`[ \t]+`)
			s = strings.TrimLeft(s, " \t")
		default:
			n := strings.IndexAny(s, " \t")
			if d := strings.Index(s, "..."); d >= 0 && (n < 0 || d < n) {
				n = d
			}
			if n < 0 {
				n = len(s)
			}
			b.WriteString(regexp.QuoteMeta(s[:n]))
			s = s[n:]
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// outputMismatch says how got differs from a page's output block, or "".
func outputMismatch(want, got []string) string {
	for i := 0; i < max(len(want), len(got)); i++ {
		switch {
		case i >= len(got):
			return fmt.Sprintf("line %d: want %q, got nothing more", i+1, want[i])
		case i >= len(want):
			return fmt.Sprintf("line %d: got %q, more than the page shows", i+1, got[i])
		case !outputLine(want[i]).MatchString(strings.TrimRight(got[i], " \t")):
			return fmt.Sprintf("line %d: want %q, got %q", i+1, want[i], got[i])
		}
	}
	return ""
}

func TestOutputLine(t *testing.T) {
	for _, c := range []struct {
		want, got string
		ok        bool
	}{
		{"10003", "10003", true},
		{"10003", "10004", false},
		{"scheduled 0 for ... (partition 0)", "scheduled 0 for 2026-12-02T01:19:07.785Z (partition 0)", true},
		{"scheduled 0 for ... (partition 0)", "scheduled 0 for 2026-12-02T01:19:07.785Z (partition 1)", false},
		{"0   reminders  0          ...         ... 1        12", "0   reminders  0          2026-12-02T01:19:07.785Z  9.919s         1        12", true},
		{"partition=0 offset=... key=\"\"\tgood-1", "partition=0 offset=7 key=\"\"\tgood-1", true},
		{"a.b", "axb", false},
		{"total lag: 0", "total lag: 0  ", true},
		{"total lag: 0", "total lag: 01", false},
	} {
		if ok := outputLine(c.want).MatchString(strings.TrimRight(c.got, " \t")); ok != c.ok {
			t.Errorf("outputLine(%q) on %q: %v, want %v", c.want, c.got, ok, c.ok)
		}
	}
}

// buildLine is a page's `go build -o NAME ./PKG`.
var buildLine = regexp.MustCompile(`^go build -o (\S+) (\./\S+)$`)

// jobNotice is what bash prints when a background job it started dies
// of SIGKILL (an interactive shell prints "[1]+ Killed ..." instead): not
// the commands' output, so the page does not show it.
var jobNotice = regexp.MustCompile(`^\S+: line \d+: +\d+ Killed +`)

// TestDocsQuickstart runs docs/quickstart.md: every command of its shell
// blocks as written, in order, in one bash in an empty directory, against
// the broker its first block starts; what each block prints (stdout and
// stderr) must match the output block that follows it (outputLine), or be
// nothing. A `go build -o NAME ./PKG` line is done by the test (herald is
// the binary TestMain built; others are built into the directory), and
// the page's Go example must be the file it names. The broker listens on
// free ports, given to it and to the clients through HERALD_LISTEN,
// HERALD_ADMIN and HERALD_ADDR. At the end nothing the page started may
// still run.
func TestDocsQuickstart(t *testing.T) { runDocPage(t, "quickstart.md", 10) }

// runDocPage runs docs/PAGE as TestDocsQuickstart says, and fails unless
// it has at least minSteps shell blocks.
func runDocPage(t *testing.T, page string, minSteps int) {
	name := "docs/" + page
	at := func(line int) string { return fmt.Sprintf("%s:%d", name, line) }
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s needs %s: %v", name, tool, err)
		}
	}
	text, err := os.ReadFile("../" + name)
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		line   int
		script []string
		want   []string
	}
	var steps []step
	dir, scripts := t.TempDir(), t.TempDir()
	for _, b := range fencedBlocks(t, string(text)) {
		switch b.lang {
		case "sh":
			s := step{line: b.line}
			for _, l := range b.lines {
				m := buildLine.FindStringSubmatch(strings.TrimSpace(l))
				switch {
				case m == nil:
					s.script = append(s.script, l)
					continue
				case m[2] == "./cmd/herald":
					err = os.Symlink(heraldBin, filepath.Join(dir, m[1]))
				default:
					out, berr := exec.Command("go", "build", "-o", filepath.Join(dir, m[1]), ".."+m[2][1:]).CombinedOutput()
					if berr != nil {
						err = fmt.Errorf("%v\n%s", berr, out)
					}
				}
				if err != nil {
					t.Fatalf("%s: %s: %v", at(b.line), l, err)
				}
				s.script = append(s.script, ": "+l) // done
			}
			steps = append(steps, s)
		case "":
			if len(steps) == 0 || steps[len(steps)-1].want != nil {
				t.Fatalf("%s: an output block that follows no shell block", at(b.line))
			}
			steps[len(steps)-1].want = b.lines
		case "go":
			name, ok := strings.CutPrefix(b.lines[0], "// Command ")
			if !ok {
				t.Fatalf("%s: a Go block that does not start with // Command NAME", at(b.line))
			}
			file := "../examples/" + strings.Fields(name)[0] + "/main.go"
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%s: %v", at(b.line), err)
			}
			if string(src) != strings.Join(b.lines, "\n")+"\n" {
				t.Fatalf("%s: the Go block is not %s", at(b.line), file)
			}
		default:
			t.Fatalf("%s: a block of %q, which the test does not know", at(b.line), b.lang)
		}
	}
	if len(steps) < minSteps {
		t.Fatalf("only %d shell blocks found in %s", len(steps), name)
	}

	// Free ports for the broker; it binds them again after each restart.
	var ports []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().String())
		l.Close()
	}
	sh := exec.Command("bash", "--norc", "--noprofile")
	sh.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HERALD_") {
			sh.Env = append(sh.Env, kv)
		}
	}
	sh.Env = append(sh.Env, "HERALD_LISTEN="+ports[0], "HERALD_ADDR="+ports[0], "HERALD_ADMIN="+ports[1])
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the page's background jobs join its group
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	sh.Stdout, sh.Stderr = pw, pw
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	pgid := sh.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- sh.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-pgid, syscall.SIGKILL) // whatever a failed run left
		pr.Close()
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(dir, "broker.log")); err == nil {
				t.Logf("broker.log:\n%s", log)
			}
		}
	})
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()

	start := time.Now()
	for i, s := range steps {
		path := filepath.Join(scripts, fmt.Sprintf("block%02d.sh", i))
		if err := os.WriteFile(path, []byte(strings.Join(s.script, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		done := fmt.Sprintf("__quickstart_block_%d_done__", i)
		if _, err := fmt.Fprintf(stdin, ". %s </dev/null; echo %s\n", path, done); err != nil {
			t.Fatalf("%s: the shell is gone: %v", at(s.line), err)
		}
		began := time.Now()
		var got []string
		timeout := time.After(60 * time.Second)
	read:
		for {
			select {
			case l, ok := <-lines:
				switch {
				case !ok:
					t.Fatalf("%s: the shell ended; it printed:\n%s", at(s.line), strings.Join(got, "\n"))
				case l == done:
					break read
				case !jobNotice.MatchString(l):
					got = append(got, l)
				}
			case <-timeout:
				t.Fatalf("%s: the block did not finish within 60s; it printed:\n%s", at(s.line), strings.Join(got, "\n"))
			}
		}
		if d := outputMismatch(s.want, got); d != "" {
			t.Fatalf("%s: the block's output is not the page's: %s\nblock:\n%s\nprinted:\n%s",
				at(s.line), d, strings.Join(s.script, "\n"), strings.Join(got, "\n"))
		}
		t.Logf("%s: ok in %v", at(s.line), time.Since(began).Round(time.Millisecond))
	}
	stdin.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the shell exited with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the shell did not exit at the end of the page")
	}
	if err := syscall.Kill(-pgid, 0); err != syscall.ESRCH {
		out, _ := exec.Command("pgrep", "-a", "-g", fmt.Sprint(pgid)).CombinedOutput()
		t.Fatalf("the page leaves processes running:\n%s", out)
	}
	t.Logf("%s ran in %v", name, time.Since(start).Round(time.Millisecond))
}
