package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// TestReadmePushExample checks that docs/sdk.md shows pushAndRequest byte for
// byte, and runs it against the in-process fake broker (the e2e tests run
// the SDK against the real one).
func TestReadmePushExample(t *testing.T) {
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	// The marker is split so that this line does not match itself.
	start := strings.Index(s, "\nfunc "+"pushAndRequest(")
	if start < 0 {
		t.Fatal("pushAndRequest not found in readme_test.go")
	}
	end := strings.Index(s[start:], "\n}\n")
	fn := s[start+1 : start+end+3]
	readme, err := os.ReadFile("../docs/sdk.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), fn) {
		t.Errorf("docs/sdk.md's push-consumer example differs from pushAndRequest in client/readme_test.go; copy it:\n%s", fn)
	}

	b, err := fakebroker.New()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pushAndRequest(ctx, b.Addr()); err != nil {
		t.Fatal(err)
	}
}

// pushAndRequest is README.md's push-consumer and request-reply example.
// Keep the two identical.
func pushAndRequest(ctx context.Context, addr string) error {
	c, err := client.Dial(ctx, addr, client.WithClientID("billing"))
	if err != nil {
		return err
	}
	defer c.Close()
	for _, topic := range []string{"invoices", "prices"} {
		_, err = c.CreateTopic(ctx, topic, &heraldpb.TopicConfig{Partitions: 3})
		if err != nil && !client.IsCode(err, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
			return err
		}
	}

	// A push consumer in group "billing". The broker pushes while the
	// subscription has credits: never more than Window (default 256)
	// messages are delivered and unfinished. Handlers run on Concurrency
	// goroutines; a handler that returns without Ack or Nack acks.
	const n = 10
	var handled atomic.Int64
	done := make(chan struct{})
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{
		Group: "billing", Topic: "invoices", Mode: client.Shared,
		From: client.Earliest(), Concurrency: 4,
		OnError: func(err error) { log.Print(err) }, // it resubscribes by itself
	}, func(ctx context.Context, m *client.Delivered) {
		if len(m.Value) == 0 {
			m.Nack(time.Second) // redelivered in a second, preferably to another member
			return
		}
		fmt.Printf("invoice %s: partition %d offset %d delivery %d\n", m.Value, m.Partition, m.Offset, m.DeliveryCount)
		m.Ack() // batched: one AckRequest per 256 acks or per millisecond
		if handled.Add(1) == n {
			close(done)
		}
	})
	if err != nil {
		return err // for example INVALID_FILTER or GROUP_CONFLICT: not retryable
	}
	p := c.NewProducer()
	for i := 0; i < n; i++ {
		p.SendAsync(ctx, &client.Message{Topic: "invoices", Value: []byte(fmt.Sprintf("inv-%d", i))}, nil)
	}
	if err := p.Close(ctx); err != nil {
		return err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := sub.Flush(ctx); err != nil { // every ack so far is durable on the broker
		return err
	}
	if err := sub.Close(ctx); err != nil { // waits for handlers, flushes, leaves the group
		return err
	}

	// Request-reply: a responder group answers Requests on "prices"; the
	// reply goes straight back to the caller's connection.
	resp, err := c.Respond(ctx, "prices", "pricing", func(ctx context.Context, req *client.Delivered) (*client.Message, error) {
		if string(req.Value) == "" {
			return nil, errors.New("no sku") // the caller gets a *client.ResponderError
		}
		return &client.Message{Value: []byte("42.00 EUR")}, nil
	})
	if err != nil {
		return err
	}
	defer resp.Close(context.Background())
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reply, err := c.Request(callCtx, "prices", &client.Message{Value: []byte("sku-1")})
	if err != nil {
		return err // NO_RESPONDERS, *client.ResponderError, context.DeadlineExceeded, ...
	}
	fmt.Printf("sku-1 costs %s\n", reply.Value)
	return nil
}
