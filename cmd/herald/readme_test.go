package main

// README checks: the configuration table, the error-code table and the Go
// SDK example in README.md must match the code, so the docs cannot drift.
//
// The tables are parsed simply: a row is a line starting with "|", cells
// are split on "|" and trimmed, and a cell's value is the text between its
// first pair of backticks (`""` means the empty string).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/broker"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// readREADME returns the manual: README.md and every page of docs/, one
// after the other (the tables and examples checked here live in docs/).
func readREADME(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("docs/*.md: %v %v", pages, err)
	}
	for _, p := range pages {
		d, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b = append(append(b, '\n'), d...)
	}
	return string(b)
}

// readmeSection returns the lines of the "## title" section.
func readmeSection(t *testing.T, readme, title string) []string {
	t.Helper()
	var out []string
	in := false
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = strings.TrimSpace(strings.TrimPrefix(line, "## ")) == title
			continue
		}
		if in {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		t.Fatalf("README.md has no section %q", title)
	}
	return out
}

// tableRows returns the data rows (not the header or the |---| line) of
// the first table whose header starts with the given first cell.
func tableRows(t *testing.T, lines []string, firstHeader string) [][]string {
	t.Helper()
	var rows [][]string
	found := false
	for _, line := range lines {
		if !strings.HasPrefix(line, "|") {
			if found {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if !found {
			if cells[0] == firstHeader {
				found = true
			}
			continue
		}
		if strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows = append(rows, cells)
	}
	if !found {
		t.Fatalf("no table with header %q", firstHeader)
	}
	return rows
}

// code returns the text between the first pair of backticks of a cell; `""`
// is the empty string. ok is false when the cell has no backticks.
func code(cell string) (string, bool) {
	i := strings.Index(cell, "`")
	if i < 0 {
		return "", false
	}
	j := strings.Index(cell[i+1:], "`")
	if j < 0 {
		return "", false
	}
	v := cell[i+1 : i+1+j]
	if v == `""` {
		v = ""
	}
	return v, true
}

func TestReadmeConfigTable(t *testing.T) {
	rows := tableRows(t, readmeSection(t, readREADME(t), "Configuration"), "flag")
	var c broker.Config
	var cfgFile string
	fs := newServeFlags(&c, &cfgFile)
	d := broker.Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("broker.Default() does not validate: %v", err)
	}

	want := map[string]bool{"config": true}
	for _, s := range settings() {
		want[s.name] = true
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if len(r) != 6 {
			t.Errorf("config row %q has %d cells, want 6", r, len(r))
			continue
		}
		flagCell, _ := code(r[0])
		name := strings.TrimPrefix(flagCell, "--")
		if seen[name] {
			t.Errorf("README lists --%s twice", name)
		}
		seen[name] = true
		f := fs.Lookup(name)
		if f == nil || !want[name] {
			t.Errorf("README lists --%s, which herald serve does not have", name)
			continue
		}
		if env, _ := code(r[1]); env != envName(name) {
			t.Errorf("--%s: README env %q, want %q", name, env, envName(name))
		}
		key, _ := code(r[2])
		if name == "config" {
			if key != "" || strings.TrimSpace(r[2]) != "-" {
				t.Errorf("--config: README config key %q, want -", r[2])
			}
		} else if key != name {
			t.Errorf("--%s: README config key %q, want %q", name, key, name)
		}
		def, ok := code(r[3])
		if !ok {
			t.Errorf("--%s: README default %q is not in backticks", name, r[3])
		}
		// newServeFlags binds every setting with broker.Default() as its
		// default, so the flag's DefValue is the default as -h prints it.
		if def != f.DefValue {
			t.Errorf("--%s: README default %q, want %q (broker.Default)", name, def, f.DefValue)
		}
		if strings.TrimSpace(r[4]) == "" || strings.TrimSpace(r[5]) == "" {
			t.Errorf("--%s: README row needs units and meaning", name)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("README configuration table misses --%s (default %q)", name, fs.Lookup(name).DefValue)
		}
	}
	// Cross-check that DefValue really is broker.Default for a few typed fields.
	for name, v := range map[string]string{
		"data": d.DataDir, "listen": d.Listen, "admin": d.Admin, "flush": d.Flush,
		"segment-bytes": strconv.Itoa(d.SegmentBytes), "idle-timeout": d.IdleTimeout.String(),
		"log-level": d.LogLevel,
	} {
		if got := fs.Lookup(name).DefValue; got != v {
			t.Errorf("--%s: flag default %q, broker.Default %q", name, got, v)
		}
	}
}

func TestReadmeErrorCodes(t *testing.T) {
	rows := tableRows(t, readmeSection(t, readREADME(t), "Error codes"), "code")
	type row struct {
		num            int
		retriable, fin string
		when, whatToDo string
	}
	byName := map[string]row{}
	for _, r := range rows {
		if len(r) != 6 {
			t.Errorf("error row %q has %d cells, want 6", r, len(r))
			continue
		}
		n, err := strconv.Atoi(r[0])
		if err != nil {
			t.Errorf("error row %q: code %q is not a number", r, r[0])
			continue
		}
		name, _ := code(r[1])
		if _, dup := byName[name]; dup {
			t.Errorf("README lists %s twice", name)
		}
		byName[name] = row{n, r[2], r[3], r[4], r[5]}
	}
	final := map[heraldpb.ErrorCode]bool{
		heraldpb.ErrorCode_MALFORMED_FRAME: true, heraldpb.ErrorCode_FRAME_TOO_LARGE: true,
		heraldpb.ErrorCode_UNKNOWN_REQUEST: true, heraldpb.ErrorCode_TOO_MANY_CONNECTIONS: true,
		heraldpb.ErrorCode_IDLE_TIMEOUT: true,
	}
	yesNo := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	for num, name := range heraldpb.ErrorCode_name {
		if num == 0 {
			continue
		}
		ec := heraldpb.ErrorCode(num)
		r, ok := byName[name]
		if !ok {
			t.Errorf("README error table misses %s (%d)", name, num)
			continue
		}
		delete(byName, name)
		if r.num != int(num) {
			t.Errorf("%s: README number %d, want %d", name, r.num, num)
		}
		if want := yesNo(heraldpb.IsRetriableCode(ec)); r.retriable != want {
			t.Errorf("%s: README retriable %q, want %q (heraldpb.IsRetriableCode)", name, r.retriable, want)
		}
		want := yesNo(final[ec])
		switch ec { // final in some cases only
		case heraldpb.ErrorCode_NOT_AUTHENTICATED:
			want = "after a failed login" // a request before the login is answered, not closed
		case heraldpb.ErrorCode_VHOST_NOT_FOUND:
			want = "in Hello"
		case heraldpb.ErrorCode_QUOTA_EXCEEDED:
			want = "for connections"
		}
		if r.fin != want {
			t.Errorf("%s: README final %q, want %q", name, r.fin, want)
		}
		if r.when == "" || r.whatToDo == "" {
			t.Errorf("%s: README row needs when and what to do", name)
		}
	}
	for name := range byName {
		t.Errorf("README error table lists %s, which is not a heraldpb.ErrorCode", name)
	}
}

// TestReadmeSDKExample runs produceAndConsume against an in-process broker
// and checks that README.md shows the same function, byte for byte.
func TestReadmeSDKExample(t *testing.T) {
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	// The marker is split so that this line does not match itself.
	start := strings.Index(s, "\nfunc "+"produceAndConsume(")
	if start < 0 {
		t.Fatal("produceAndConsume not found in readme_test.go")
	}
	end := strings.Index(s[start:], "\n}\n")
	if end < 0 {
		t.Fatal("end of produceAndConsume not found in readme_test.go")
	}
	fn := s[start+1 : start+end+3]
	if !strings.Contains(readREADME(t), fn) {
		t.Errorf("README.md's Go SDK example differs from produceAndConsume in readme_test.go; copy it:\n%s", fn)
	}

	cfg := broker.Default()
	cfg.DataDir, cfg.Listen, cfg.Admin, cfg.LogLevel = t.TempDir(), "127.0.0.1:0", "", "warn"
	b, err := broker.Start(cfg, slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := produceAndConsume(ctx, b.ClientAddr()); err != nil {
		t.Fatal(err)
	}
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// produceAndConsume is README.md's Go SDK example. Keep the two identical.
func produceAndConsume(ctx context.Context, addr string) error {
	c, err := client.Dial(ctx, addr, client.WithClientID("orders-service"))
	if err != nil {
		return err
	}
	defer c.Close()

	// Create the topic; one that exists already is fine.
	_, err = c.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 3})
	if err != nil && !client.IsCode(err, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
		return err
	}

	// A producer batches per partition (linger, batch size), keeps at most one
	// batch per partition in flight so keyed records stay in order, and retries
	// retryable errors itself (WithMaxRetries, WithRetryBackoff). It is
	// idempotent: a retried batch is written once (WithIdempotence). It picks
	// the partition: the key's (PartitionForKey), or spread for records
	// without a key. WithManualPartitions makes it use Message.Partition.
	p := c.NewProducer(client.WithAcks(heraldpb.Acks_ACKS_ALL), client.WithLinger(5*time.Millisecond))
	defer p.Close(context.Background())

	var failed atomic.Int64
	for i := 0; i < 100; i++ {
		m := &client.Message{Topic: "orders", Key: []byte("customer-42"),
			Value: []byte(fmt.Sprintf("event %d", i))}
		p.SendAsync(ctx, m, func(r client.Result, err error) {
			if err != nil { // runs on a producer goroutine
				failed.Add(1)
			}
		})
	}
	if err := p.Flush(ctx); err != nil { // waits for every callback above
		return err
	}
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d records failed", n)
	}

	// Send waits for the acknowledgement and returns where the record went.
	r, err := p.Send(ctx, &client.Message{Topic: "orders", Key: []byte("customer-42"),
		Value: []byte("order-1 shipped")})
	if err != nil {
		var he *client.Error
		switch {
		case errors.As(err, &he) && he.Code == heraldpb.ErrorCode_MESSAGE_TOO_LARGE:
			return fmt.Errorf("record rejected for good: %s", he.Message)
		case client.IsRetryable(err):
			// The producer already retried; try again later. The record may have been written.
			return fmt.Errorf("broker busy or unreachable, retry later: %w", err)
		default:
			return err
		}
	}
	fmt.Printf("written to partition %d at offset %d\n", r.Partition, r.Offset)

	// A pull consumer of all partitions from the earliest offset. Poll long-polls
	// the partitions in the background and returns what is ready.
	cs := c.NewConsumer("orders", client.Earliest(), nil)
	defer cs.Close()
	pollCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for seen := 0; seen < 101; {
		msgs, err := cs.Poll(pollCtx)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			seen++
			if string(m.Value) == "order-1 shipped" {
				fmt.Printf("consumed %q from partition %d offset %d\n", m.Value, m.Partition, m.Offset)
			}
		}
	}
	return nil
}

// TestDocsCLIHelp checks that docs/cli.md shows the command list `herald
// --help` prints, line for line.
func TestDocsCLIHelp(t *testing.T) {
	var b strings.Builder
	printUsage(&b)
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "  ") && !strings.Contains(string(doc), line+"\n") {
			t.Errorf("docs/cli.md lacks the help line %q", line)
		}
	}
}
