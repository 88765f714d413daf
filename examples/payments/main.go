// Command payments is the Go SDK example of docs/quickstart.md, which shows
// it whole: a member of consumer group "payments" that acks every record of
// topic "payments" except those starting with "bad", which it fails. The
// broker redelivers a failed record by the group's retry policy and, after
// its third failed delivery, moves it to the dead-letter topic payments.dlq.
// The program stops once -n records are done (acked, or failed for the
// last time). It reads the broker address from HERALD_ADDR.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/client"
)

func main() {
	n := flag.Int("n", 3, "stop once this many records are done")
	flag.Parse()
	addr := os.Getenv("HERALD_ADDR")
	if addr == "" {
		addr = "127.0.0.1:7420"
	}
	ctx := context.Background()
	c, err := client.Dial(ctx, addr, client.WithClientID("payments"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	const maxDeliveries = 3
	var done, gaveUp atomic.Int64
	finished := make(chan struct{})
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{
		Group:       "payments",
		Topic:       "payments",
		Mode:        client.Shared,
		From:        client.Earliest(),
		RetryPolicy: fmt.Sprintf("100ms max-deliveries=%d", maxDeliveries),
	}, func(ctx context.Context, m *client.Delivered) {
		if bytes.HasPrefix(m.Value, []byte("bad")) {
			m.Fail("card declined") // redelivered in 100ms, or dead-lettered
			if m.DeliveryCount < maxDeliveries {
				return
			}
			fmt.Printf("gave up on %s after %d deliveries\n", m.Value, m.DeliveryCount)
			gaveUp.Add(1)
		} else {
			m.Ack()
			fmt.Printf("paid %s\n", m.Value)
		}
		if done.Add(1) == int64(*n) {
			close(finished)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	<-finished
	// The broker appends a dead letter while its group has a live member:
	// stay until it has appended ours (DescribeGroup counts them).
	for {
		g, err := c.DescribeGroup(ctx, "payments")
		if err != nil {
			log.Fatal(err)
		}
		if g.GetDeadLettered() >= uint64(gaveUp.Load()) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Close makes the acks durable and leaves the group.
	if err := sub.Close(ctx); err != nil {
		log.Fatal(err)
	}
}
