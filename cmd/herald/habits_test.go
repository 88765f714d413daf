package main

// CLI habits (issue 15 §6): "did you mean" for mistyped flags and
// commands, the create-topic hint on TOPIC_NOT_FOUND, described commands in
// --help, the mode-change warning of consume --group, and plurals.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

func TestSuggest(t *testing.T) {
	known := []string{"group", "partitions", "partition", "key", "keys", "to", "topic", "timeout", "max", "mode"}
	for _, c := range []struct {
		typed string
		want  []string
	}{
		{"gruop", []string{"group"}}, // a swap is one edit
		{"grop", []string{"group"}},  // a letter missing
		{"GROUP", []string{"group"}}, // case
		{"partitons", []string{"partitions"}},
		{"partitio", []string{"partition"}},
		{"partitn", []string{"partition"}}, // two edits, not three
		{"kes", []string{"key", "keys"}},   // ties are all given
		{"topc", []string{"topic"}},
		{"tmeout", []string{"timeout"}},
		{"tim", []string{"timeout"}}, // a prefix of one known word
		{"mx", []string{"max"}},
		{"xyz", nil},
		{"m", nil},   // "m" is two edits from max and mode: too far for a short word
		{"grp", nil}, // two edits, three letters: too far
		{"verbosity", nil},
	} {
		if got := suggest(c.typed, known); !slices.Equal(got, c.want) {
			t.Errorf("suggest(%q) = %q, want %q", c.typed, got, c.want)
		}
	}
}

func TestFlagTypoSuggestion(t *testing.T) {
	ctx := ctxT(t)
	for _, c := range []struct {
		fn   func(context.Context, []string, cliIO) error
		args []string
		want string
	}{
		{consumeCmd, []string{"--topic", "t", "--gruop", "g"}, "unknown flag --gruop; did you mean --group?"},
		{consumeCmd, []string{"--topic", "t", "-gruop=g"}, "unknown flag --gruop; did you mean --group?"},
		{topicCmd, []string{"create", "x", "--partitons", "3"}, "unknown flag --partitons; did you mean --partitions?"},
		{produceCmd, []string{"--topic", "t", "--ack", "all"}, "unknown flag --ack; did you mean --acks?"},
		{groupCmd, []string{"reset", "g", "--froce"}, "unknown flag --froce; did you mean --force?"},
		{benchCmd, []string{"--prodcers", "2"}, "unknown flag --prodcers; did you mean --producers?"},
		{topicCmd, []string{"list", "--zzz"}, "unknown flag --zzz (see 'herald topic -h')"},
	} {
		// Parsing fails before dialing: no broker is needed.
		_, stderr, err := runCLI(t, ctx, c.fn, "127.0.0.1:1", "", c.args...)
		if !isUsage(err) || err.Error() != c.want {
			t.Errorf("%v: %v, want the usage error %q", c.args, err, c.want)
		}
		if stderr != "" {
			t.Errorf("%v: the flag package printed %q; the one-line error says it all", c.args, stderr)
		}
	}
	// -h still prints the usage and succeeds.
	_, stderr, err := runCLI(t, ctx, topicCmd, "127.0.0.1:1", "", "-h")
	if !errors.Is(err, errCLIHelp) || !strings.Contains(stderr, topicUsage) || !strings.Contains(stderr, "-partitions") {
		t.Fatalf("topic -h: %v %q", err, stderr)
	}

	// herald serve: flags and config file keys.
	_, err = loadServeConfig([]string{"--lisen", "127.0.0.1:0"}, env(nil))
	var ue usageError
	if !errors.As(err, &ue) || err.Error() != "unknown flag --lisen; did you mean --listen?" {
		t.Errorf("serve --lisen: %v", err)
	}
	file := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(file, []byte(`{"segment-byte": 1048576}`), 0o644)
	_, err = loadServeConfig([]string{"--config", file}, env(nil))
	if !errors.As(err, &ue) || !strings.HasSuffix(err.Error(), `unknown setting "segment-byte"; did you mean "segment-bytes"?`) {
		t.Errorf("config file key: %v", err)
	}

	// Exit code 2 through the command table, and unknown commands.
	if code := run([]string{"topic", "create", "x", "--partitons", "3"}); code != 2 {
		t.Errorf("mistyped flag: exit code %d, want 2", code)
	}
	if code := run([]string{"serve", "--lisen", "x"}); code != 2 {
		t.Errorf("serve, mistyped flag: exit code %d, want 2", code)
	}
	if code := run([]string{"consme"}); code != 2 {
		t.Errorf("unknown command: exit code %d, want 2", code)
	}
}

func TestHelpDescribesCommands(t *testing.T) {
	var b bytes.Buffer
	printUsage(&b)
	out := b.String()
	if len(commands) < 10 {
		t.Fatalf("only %d commands registered", len(commands))
	}
	for name, cmd := range commands {
		if cmd.desc == "" || strings.Contains(cmd.desc, "\n") {
			t.Errorf("command %s: description %q, want one line", name, cmd.desc)
		}
		found := false
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) > 1 && f[0] == name && strings.Join(f[1:], " ") == strings.Join(strings.Fields(cmd.desc), " ") {
				found = true
			}
		}
		if !found {
			t.Errorf("herald --help does not list %s with its description:\n%s", name, out)
		}
	}
}

func TestTopicNotFoundHint(t *testing.T) {
	b := fakeBroker(t)
	ctx := ctxT(t)
	const hint = "create it with: herald topic create nope --partitions N"
	for _, c := range []struct {
		fn    func(context.Context, []string, cliIO) error
		stdin string
		args  []string
	}{
		{produceCmd, "x\n", []string{"--topic", "nope"}},
		{consumeCmd, "", []string{"--topic", "nope"}},
		{consumeCmd, "", []string{"--topic", "nope", "--partition", "0"}},
		{consumeCmd, "", []string{"--topic", "nope", "--group", "g"}},
		{topicCmd, "", []string{"describe", "nope"}},
	} {
		_, _, err := runCLI(t, ctx, c.fn, b.Addr(), c.stdin, c.args...)
		if err == nil || isUsage(err) || !strings.Contains(err.Error(), "TOPIC_NOT_FOUND") ||
			!strings.HasSuffix(err.Error(), hint) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want one line ending %q", c.args, err, hint)
		}
	}
	// Deleting a topic that does not exist gets no advice to create it.
	_, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", "delete", "nope")
	if err == nil || !strings.Contains(err.Error(), "TOPIC_NOT_FOUND") || strings.Contains(err.Error(), "create it") {
		t.Errorf("delete: %v", err)
	}
	// bench names the partitions it creates topics with; an unknown topic
	// name prints NAME.
	nf := &client.Error{Code: heraldpb.ErrorCode_TOPIC_NOT_FOUND, Message: "gone"}
	if got := cliTopicErr(nf, "b", 4).Error(); !strings.HasSuffix(got, "; create it with: herald topic create b --partitions 4") {
		t.Errorf("cliTopicErr: %q", got)
	}
	if got := cliTopicErr(nf, "", 0).Error(); !strings.HasSuffix(got, "; create it with: herald topic create NAME --partitions N") {
		t.Errorf("cliTopicErr: %q", got)
	}
	if cliTopicErr(nil, "x", 0) != nil {
		t.Error("cliTopicErr(nil) is not nil")
	}
	other := &client.Error{Code: heraldpb.ErrorCode_GROUP_CONFLICT, Message: "no"}
	if got := cliTopicErr(other, "x", 0).Error(); strings.Contains(got, "create it") {
		t.Errorf("cliTopicErr of another code: %q", got)
	}
}

func TestConsumeModeChangeWarning(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 2))
	ctx := ctxT(t)
	produceLines(t, ctx, b.Addr(), "a", "b", "c", "d", "e", "f", "g", "h")
	const warning = "herald consume: warning: group g is in shared mode; subscribing in clustering mode changes it for every member\n"

	// A new group: nothing to warn about.
	_, stderr, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g", "--mode", "shared", "--from", "earliest", "--max", "1")
	if err != nil || strings.Contains(stderr, "warning") {
		t.Fatalf("first subscribe: %v %q", err, stderr)
	}
	// The same mode again: nothing either.
	_, stderr, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g", "--mode", "shared", "--max", "1")
	if err != nil || strings.Contains(stderr, "warning") {
		t.Fatalf("same mode: %v %q", err, stderr)
	}
	// Another mode, no live members: the broker takes it, the CLI warns.
	_, stderr, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g", "--max", "1")
	if err != nil || stderr != warning {
		t.Fatalf("mode change: %v, stderr %q, want %q", err, stderr, warning)
	}
	if req := b.SubscribeRequests(); req[len(req)-1].GetMode() != heraldpb.SubscriptionMode_MODE_CLUSTERING {
		t.Fatalf("subscribed in %v", req[len(req)-1].GetMode())
	}

	// With a live member in clustering mode, a shared subscription is
	// refused by the broker (GROUP_CONFLICT): no warning, the refusal.
	c, err := client.Dial(ctx, b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "g", Topic: "t", Mode: client.Clustering},
		func(context.Context, *client.Delivered) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	_, stderr, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g", "--mode", "shared", "--max", "1")
	if !client.IsCode(err, heraldpb.ErrorCode_GROUP_CONFLICT) {
		t.Fatalf("live member in another mode: %v, want GROUP_CONFLICT", err)
	}
	if strings.Contains(stderr, "warning: group") {
		t.Fatalf("warned although the broker refuses: %q", stderr)
	}
}

func TestPlurals(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{plural(0, "record"), "0 records"},
		{plural(1, "record"), "1 record"},
		{plural(int64(2), "record"), "2 records"},
		{plural(uint32(1), "partition"), "1 partition"},
		{plural(3, "live member"), "3 live members"},
		{plural(2, "retry"), "2 retries"},
		{plural(2, "key"), "2 keys"},
		{wasWere(1), "was"},
		{wasWere(0), "were"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}

	b := fakeBroker(t)
	ctx := ctxT(t)
	out, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", "create", "one", "--partitions", "1")
	if err != nil || out != "created topic one with 1 partition\n" {
		t.Fatalf("create: %q %v", out, err)
	}
	_, stderr, err := runCLI(t, ctx, produceCmd, b.Addr(), "x\n", "--topic", "one")
	if err != nil || stderr != "1 of 1 record acknowledged\n" {
		t.Fatalf("produce: %q %v", stderr, err)
	}
}
