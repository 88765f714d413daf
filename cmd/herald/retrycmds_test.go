package main

import (
	"bytes"
	"strings"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// topic create --message-ttl sends message_ttl_ms, and describe shows it.
func TestTopicMessageTTL(t *testing.T) {
	b := fakeBroker(t)
	ctx := ctxT(t)
	if _, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", "create", "news", "--partitions", "1", "--message-ttl", "30s"); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", "describe", "news")
	if err != nil || !strings.Contains(out, "message-ttl:       30s\n") {
		t.Fatalf("describe: %q %v", out, err)
	}
	for _, bad := range []string{"-1s", "500us"} {
		if _, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", "create", "x", "--message-ttl", bad); !isUsage(err) {
			t.Errorf("--message-ttl %s: %v, want a usage error", bad, err)
		}
	}
}

// group describe shows the retry policy, the dead-letter topic and the
// retry, dead-letter and expiry counts.
func TestPrintGroupRetries(t *testing.T) {
	var out bytes.Buffer
	printGroup(cliIO{out: &out}, &heraldpb.GroupInfo{Group: "billing", Topic: "invoices",
		RetryPolicy: "1s,5s max-deliveries=3", DeadLetterTopic: "billing.dlq", Retrying: 2, DeadLettered: 7, Expired: 1})
	for _, want := range []string{
		"retry:        1s,5s max-deliveries=3\n", "dlq-topic:    billing.dlq\n", "retrying:     2\n",
		"dead-letters: 7\n", "expired:      1\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in\n%s", want, out.String())
		}
	}
}
