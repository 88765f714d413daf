package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// A producer that is acknowledged once the partition's leader has written
// each batch, and a look-up of the partition's high watermark. (The
// example runs against the SDK's in-process fake broker.)
func ExampleWithAcks() {
	b, err := fakebroker.New(fakebroker.Topic("orders", 1))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := client.Dial(ctx, b.Addr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	p := c.NewProducer(client.WithAcks(client.AcksLeader))
	defer p.Close(ctx)
	r, err := p.Send(ctx, &client.Message{Topic: "orders", Value: []byte("order 1")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("written at offset", r.Offset)

	o, err := c.ListOffsets(ctx, "orders", 0, client.OffsetLatest, time.Time{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("high watermark", o.Offset)
	// Output:
	// written at offset 0
	// high watermark 1
}

// The Go names are the wire values: code written with either compiles and
// they compare equal.
func ExampleAcksAll() {
	fmt.Println(client.AcksAll == heraldpb.Acks_ACKS_ALL, client.AcksNone, client.OffsetEarliest)
	// Output: true ACKS_NONE OFFSET_SPEC_EARLIEST
}
