package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A failed run's log tails show each node's warnings, errors and
// leadership lines from before its last lines (its directory, logs
// included, is deleted with the run), and its last lines; not the
// transport's reconnection noise.
func TestLogTailsKeepNotableLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node-1.log")
	var lines []string
	lines = append(lines, `level=INFO msg="became leader" topic=__groups partition=0 replica=3 term=5`,
		`level=WARN msg="4 attempted to restore snapshot but it is not in the ConfState"`,
		`level=ERROR msg="EndpointWriter lost connection" component=cluster`,
		`level=INFO msg="nothing to see"`)
	for i := range 30 {
		lines = append(lines, fmt.Sprintf(`level=INFO msg="herald not ready yet" n=%d`, i))
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{nodes: map[uint64]*proc{1: {info: Node{ID: 1, LogPath: path}}}}
	got := c.LogTails()
	for _, want := range []string{"became leader", "not in the ConfState", "its last 2 warnings", `n=29`, `n=15`} {
		if !strings.Contains(got, want) {
			t.Errorf("the tails lack %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"EndpointWriter", "nothing to see", "n=14\n"} {
		if strings.Contains(got, not) {
			t.Errorf("the tails hold %q:\n%s", not, got)
		}
	}
}
