package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// herald runs the built binary with args and stdin, returning stdout,
// stderr and the exit code.
func herald(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(heraldBin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("herald %v did not finish in 60s", args)
		return "", "", -1
	}
}

// TestCLI drives the real binary against a real broker process: topic
// admin, produce from stdin with a key, synthetic produce, consume from
// earliest, from an offset and from a time, and the exit codes.
func TestCLI(t *testing.T) {
	n := startProc(t, t.TempDir())
	addr := "--addr=" + n.Addr()
	run := func(stdin string, want int, args ...string) string {
		t.Helper()
		out, errs, code := herald(t, stdin, append(args, addr)...)
		if code != want {
			t.Fatalf("herald %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, errs)
		}
		return out
	}
	run("", 0, "topic", "create", "orders", "--partitions", "3")
	if out := run("", 0, "topic", "list"); !strings.Contains(out, "orders") {
		t.Fatalf("topic list: %q", out)
	}
	if out := run("", 0, "topic", "describe", "orders"); strings.Count(out, "\n") < 3 {
		t.Fatalf("topic describe shows too little: %q", out)
	}
	_, errs, code := herald(t, "", "topic", "create", "orders", "--partitions", "3", addr)
	if code != 1 || !strings.Contains(errs, "TOPIC_ALREADY_EXISTS") || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("duplicate create: exit %d, stderr %q (want exit 1 and one line)", code, errs)
	}
	if _, _, code := herald(t, "", "topic", "create", addr); code != 2 {
		t.Fatalf("create without a name: exit %d, want 2", code)
	}

	// One key: every line lands on one partition, in order.
	var lines []string
	for i := 0; i < 50; i++ {
		lines = append(lines, fmt.Sprintf("line-%02d", i))
	}
	before := time.Now()
	run(strings.Join(lines, "\n")+"\n", 0, "produce", "--topic", "orders", "--key", "customer-7")
	run("", 0, "produce", "--topic", "orders", "--count", "30", "--size", "64")

	out := run("", 0, "consume", "--topic", "orders", "--from", "earliest")
	got := strings.Split(strings.TrimSpace(out), "\n")
	if len(got) != 80 {
		t.Fatalf("consumed %d lines, want 80", len(got))
	}
	var keyed []string
	for _, l := range got {
		if strings.HasPrefix(l, "line-") {
			keyed = append(keyed, l)
		}
	}
	if strings.Join(keyed, ",") != strings.Join(lines, ",") {
		t.Fatalf("keyed lines out of order or missing: %v", keyed)
	}
	// --from a time before the produce reads everything; --max bounds it.
	out = run("", 0, "consume", "--topic", "orders", "--from", before.Add(-time.Second).Format(time.RFC3339), "--max", "5")
	if n := len(strings.Split(strings.TrimSpace(out), "\n")); n != 5 {
		t.Fatalf("--max 5 printed %d lines", n)
	}
	// --from an offset on one partition, with metadata.
	out = run("", 0, "consume", "--topic", "orders", "--partition", "0", "--from", "0", "--verbose", "--max", "1")
	if !strings.Contains(out, "offset=0") {
		t.Fatalf("--verbose output lacks offset: %q", out)
	}
	if _, _, code := herald(t, "", "consume", "--topic", "orders", "--from", "yesterday", addr); code != 2 {
		t.Fatalf("bad --from: exit %d, want 2", code)
	}
	run("", 0, "topic", "delete", "orders")
	if _, _, code := herald(t, "", "consume", "--topic", "orders", addr); code != 1 {
		t.Fatalf("consume of a deleted topic: exit %d, want 1", code)
	}
}

// TestMetricsExposed checks /metrics carries the series the issue names
// after a little traffic, and /healthz answers.
func TestMetricsExposed(t *testing.T) {
	n := startProc(t, t.TempDir())
	addr := "--addr=" + n.Addr()
	herald(t, "", "topic", "create", "m", "--partitions", "1", addr)
	herald(t, "", "produce", "--topic", "m", "--count", "100", "--size", "100", addr)
	herald(t, "", "consume", "--topic", "m", "--from", "earliest", addr)
	for _, name := range []string{
		"herald_produce_records_total", "herald_produce_bytes_total", "herald_fetch_records_total", "herald_fetch_bytes_total",
		"herald_log_start_offset", "herald_log_end_offset", "herald_high_watermark",
		"herald_fsync_seconds_count", "herald_save_batch_entries_count", "herald_partition_mailbox_depth", "herald_throttled_total",
		"herald_connections", "herald_inflight_requests",
	} {
		checkFor(t, 5*time.Second, "metric "+name, func() error {
			if !metricPresent(t, n, name) {
				return fmt.Errorf("%s missing", name)
			}
			return nil
		})
	}
	if v := metricSum(t, n, "herald_produce_records_total"); v != 100 {
		t.Fatalf("herald_produce_records_total = %v, want 100", v)
	}
	if v := metricSum(t, n, "herald_high_watermark"); v != 100 {
		t.Fatalf("herald_high_watermark = %v, want 100", v)
	}
	checkFor(t, 5*time.Second, "fetch records counted", func() error {
		if v := metricSum(t, n, "herald_fetch_records_total"); v < 100 {
			return fmt.Errorf("herald_fetch_records_total = %v", v)
		}
		return nil
	})
}

// The consumer-group metrics move with a `herald consume --group` run.
func TestConsumerMetricsExposed(t *testing.T) {
	n := startProc(t, t.TempDir())
	addr := "--addr=" + n.Addr()
	herald(t, "", "topic", "create", "cm", "--partitions", "2", addr)
	herald(t, "", "produce", "--topic", "cm", "--count", "100", "--size", "100", addr)
	if _, stderr, code := herald(t, "", "consume", "--topic", "cm", "--group", "gm", "--mode", "shared", "--from", "earliest", "--max", "100", addr); code != 0 {
		t.Fatalf("consume --group: exit %d: %s", code, stderr)
	}
	for name, want := range map[string]float64{
		"herald_consumer_delivered_total": 100, "herald_consumer_acked_total": 100, "herald_consumer_lag": 0,
	} {
		checkFor(t, 10*time.Second, "metric "+name, func() error {
			if v := metricSum(t, n, name); v != want {
				return fmt.Errorf("%s = %v, want %v", name, v, want)
			}
			return nil
		})
	}
	for _, name := range []string{"herald_consumer_progress_writes_total", "herald_consumer_ack_latency_seconds_count"} {
		if v := metricSum(t, n, name); v <= 0 {
			t.Fatalf("%s = %v, want > 0", name, v)
		}
	}
	if !metricPresent(t, n, "herald_consumer_members") || !metricPresent(t, n, "herald_consumer_in_flight") {
		t.Fatal("member and in-flight gauges missing")
	}
}
