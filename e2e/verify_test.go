package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchAckLogVerify: `herald bench --ack-log` records which records
// the broker acknowledged, and `herald verify` reads the topic back and
// finds every one of them exactly once. Against a topic that lacks them,
// verify reports them missing and fails.
func TestBenchAckLogVerify(t *testing.T) {
	b := startProc(t, t.TempDir())
	ackLog := filepath.Join(t.TempDir(), "acks.json")
	out, errOut, code := herald(t, "", "bench", "--addr", b.Addr(), "--topic", "v", "--partitions", "3", "--count", "3000",
		"--consumers", "0", "--size", "64", "--report-interval", "0", "--ack-log", ackLog)
	if code != 0 {
		t.Fatalf("bench: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = herald(t, "", "verify", "--addr", b.Addr(), "--ack-log", ackLog)
	if code != 0 || !strings.Contains(out, "verified 3000 acknowledged records of topic v: 0 missing, 0 stored more than once") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errOut)
	}
	c := dial(t, b)
	defer c.Close()
	createTopic(t, c, "w", 3)
	out, errOut, code = herald(t, "", "verify", "--addr", b.Addr(), "--ack-log", ackLog, "--topic", "w")
	if code == 0 || !strings.Contains(errOut, "3000 acknowledged records are missing") {
		t.Fatalf("verify against a topic without them: exit %d\n%s%s", code, out, errOut)
	}
}
