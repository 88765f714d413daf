// Command outbox is the half-message example of docs/transactions.md: an
// order service that must store an order and publish "order created"
// together, or do neither. `outbox place ORDER` sends the message as a
// half message (invisible to consumers), stores the order in its local
// database (a file of one order per line, fsynced) and commits the half;
// if storing fails it rolls the half back. `outbox checker` answers the
// broker's check-backs for halves nobody ended (the placing process died
// in between): commit if the order is in the database, else roll back.
// Both read the broker address from HERALD_ADDR. For the tests,
// --stop-after half|stored makes `place` stop at that point and wait to
// be killed.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/heraldmq/herald/client"
)

const group = "order-service"

var opts = client.HalfOptions{ProducerGroup: group, CheckInterval: time.Second}

func main() {
	db := flag.String("db", "orders.db", "the order service's database: one order id per line")
	stopAfter := flag.String("stop-after", "", "place: stop after the half is sent (half) or the order stored (stored), and wait")
	flag.Parse()
	addr := os.Getenv("HERALD_ADDR")
	if addr == "" {
		addr = "127.0.0.1:7420"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	c, err := client.Dial(ctx, addr, client.WithClientID("outbox"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	switch flag.Arg(0) {
	case "place":
		place(ctx, c, *db, flag.Arg(1), *stopAfter)
	case "checker":
		checker(ctx, c, *db)
	default:
		log.Fatal("usage: outbox [--db FILE] place ORDER | checker")
	}
}

// place stores order and publishes it, atomically.
func place(ctx context.Context, c *client.Client, db, order, stopAfter string) {
	msg := &client.Message{Topic: "orders", Key: []byte(order), Value: []byte(order + " created")}
	h, err := c.SendInTransaction(ctx, msg, opts, func(ctx context.Context, h *client.Half) error {
		fmt.Printf("half %s sent for %s\n", h.ID, order)
		if stopAfter == "half" {
			<-ctx.Done() // killed here: the order is not stored
		}
		if err := store(db, order); err != nil {
			return fmt.Errorf("%w: %v", client.ErrRollback, err)
		}
		fmt.Printf("stored %s\n", order)
		if stopAfter == "stored" {
			<-ctx.Done() // killed here: stored, but the half is not committed
		}
		return nil
	})
	if err != nil {
		log.Fatalf("placing %s: %v", order, err)
	}
	fmt.Printf("committed half %s: %s is published\n", h.ID, order)
}

// checker answers check-backs from the database until interrupted.
func checker(ctx context.Context, c *client.Client, db string) {
	stop, err := c.RegisterTransactionChecker(ctx, group, func(_ context.Context, hc *client.HalfCheck) client.HalfAction {
		order := string(hc.Messages[0].Key)
		stored, err := has(db, order)
		switch {
		case err != nil:
			fmt.Printf("check %d of half %s (%s): %v; unknown\n", hc.Check, hc.ID, order, err)
			return client.HalfUnknown // asked again later
		case stored:
			fmt.Printf("check %d of half %s: %s is stored; commit\n", hc.Check, hc.ID, order)
			return client.HalfCommit
		}
		fmt.Printf("check %d of half %s: %s is not stored; roll back\n", hc.Check, hc.ID, order)
		return client.HalfRollback
	})
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	fmt.Println("checker registered for", group)
	<-ctx.Done()
}

func store(db, order string) error {
	f, err := os.OpenFile(db, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, order); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func has(db, order string) (bool, error) {
	f, err := os.Open(db)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	var orders []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		orders = append(orders, strings.TrimSpace(sc.Text()))
	}
	return slices.Contains(orders, order), sc.Err()
}
