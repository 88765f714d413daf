package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/exchange"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() {
	register("exchange", "exchanges that route published messages to topics: declare, list, describe, delete", cliRunner(exchangeCmd))
	register("bind", "bind an exchange to a topic or to another exchange", cliRunner(func(ctx context.Context, args []string, io cliIO) error {
		return bindCmd(ctx, args, io, false)
	}))
	register("unbind", "remove a binding (the same flags as bind)", cliRunner(func(ctx context.Context, args []string, io cliIO) error {
		return bindCmd(ctx, args, io, true)
	}))
	register("publish", "publish stdin lines (or synthetic records) through an exchange", cliRunner(publishCmd))
}

const exchangeUsage = "usage: herald exchange declare NAME --type direct|topic|fanout|headers [--alternate X] | list | describe NAME | delete NAME [--if-unused]"

// exchangeCmd runs "herald exchange declare|list|describe|delete".
func exchangeCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("exchange", io.err)
	typ := fs.String("type", "", "declare: the exchange type, direct, topic, fanout or headers")
	alternate := fs.String("alternate", "", "declare: the exchange that receives what this one cannot route")
	ifUnused := fs.Bool("if-unused", false, "delete: only when the exchange has no bindings")
	fs.Usage = func() {
		fmt.Fprintln(io.err, exchangeUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", exchangeUsage)
	}
	sub, rest := pos[0], pos[1:]
	var kind heraldpb.ExchangeType
	switch sub {
	case "list":
		if len(rest) > 0 {
			return usagef("exchange list takes no arguments")
		}
	case "declare":
		if len(rest) != 1 {
			return usagef("exchange declare needs exactly one NAME")
		}
		var ok bool
		if kind, ok = exchange.ParseType(*typ); !ok {
			return usagef("--type %q: want direct, topic, fanout or headers", *typ)
		}
	case "describe", "delete":
		if len(rest) != 1 {
			return usagef("exchange %s needs exactly one NAME", sub)
		}
	default:
		return usagef("unknown subcommand %q; %s", sub, exchangeUsage)
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	switch sub {
	case "declare":
		created, err := c.DeclareExchange(ctx, rest[0], kind, *alternate)
		if err != nil {
			return cliOneLine(err)
		}
		if created {
			fmt.Fprintf(io.out, "declared %s exchange %s\n", *typ, rest[0])
		} else {
			fmt.Fprintf(io.out, "%s exchange %s exists already\n", *typ, rest[0])
		}
	case "delete":
		if err := c.DeleteExchange(ctx, rest[0], *ifUnused); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "deleted exchange %s\n", rest[0])
	case "list":
		xs, err := c.ListExchanges(ctx, "")
		if err != nil {
			return cliOneLine(err)
		}
		tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "EXCHANGE\tTYPE\tALTERNATE\tBINDINGS\tPUBLISHED\tROUTED\tUNROUTABLE")
		for _, x := range xs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", x.Config.Name, exchange.TypeName(x.Config.Type), orDash(x.Config.Alternate),
				len(x.Bindings), x.Published, x.Routed, x.Unroutable)
		}
		return tw.Flush()
	case "describe":
		xs, err := c.ListExchanges(ctx, rest[0])
		if err != nil {
			return cliOneLine(err)
		}
		x := xs[0]
		fmt.Fprintf(io.out, "exchange %s: %s, alternate %s; published %d, routed %d, unroutable %d, returned %d (this node)\n",
			x.Config.Name, exchange.TypeName(x.Config.Type), orDash(x.Config.Alternate), x.Published, x.Routed, x.Unroutable, x.Returned)
		tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DESTINATION\tKEY\tHEADERS")
		for _, b := range x.Bindings {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", bindingDest(b), keyText(b, x.Config.Type), headersText(b))
		}
		return tw.Flush()
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func bindingDest(b *heraldpb.Binding) string {
	if b.ToExchange != "" {
		return "exchange " + b.ToExchange
	}
	return "topic " + b.Topic
}

func keyText(b *heraldpb.Binding, t heraldpb.ExchangeType) string {
	switch t {
	case heraldpb.ExchangeType_EXCHANGE_FANOUT, heraldpb.ExchangeType_EXCHANGE_HEADERS:
		return "-"
	}
	return fmt.Sprintf("%q", b.Key)
}

func headersText(b *heraldpb.Binding) string {
	if len(b.Headers) == 0 {
		if b.MatchAny {
			return "(none; any: matches nothing)"
		}
		return "-"
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(b.Headers)) {
		kv = append(kv, k+"="+b.Headers[k])
	}
	match := "all"
	if b.MatchAny {
		match = "any"
	}
	return strings.Join(kv, ",") + " (" + match + ")"
}

// headerFlags collects repeated --header k=v flags.
type headerFlags map[string]string

func (h headerFlags) String() string { return fmt.Sprint(map[string]string(h)) }

func (h headerFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want NAME=VALUE", s)
	}
	h[k] = v
	return nil
}

var _ flag.Value = headerFlags{}

// bindCmd runs "herald bind" and "herald unbind".
func bindCmd(ctx context.Context, args []string, io cliIO, unbind bool) error {
	name := "bind"
	if unbind {
		name = "unbind"
	}
	fs, cf := newCLIFlagSet(name, io.err)
	ex := fs.String("exchange", "", "the exchange to bind from (required)")
	topic := fs.String("topic", "", "the topic to bind to")
	toEx := fs.String("to-exchange", "", "the exchange to bind to (instead of a topic)")
	key := fs.String("key", "", "direct: the routing key; topic: the pattern (* one word, # zero or more)")
	hdrs := headerFlags{}
	fs.Var(hdrs, "header", "headers exchange: NAME=VALUE to match (repeat for more)")
	match := fs.String("match", "all", "headers exchange: all headers must match, or any one")
	if err := parseCLIFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *ex == "":
		return usagef("--exchange is required")
	case (*topic == "") == (*toEx == ""):
		return usagef("name exactly one destination: --topic or --to-exchange")
	case *match != "all" && *match != "any":
		return usagef("--match %q: want all or any", *match)
	}
	b := &heraldpb.Binding{Exchange: *ex, Topic: *topic, ToExchange: *toEx, Key: *key, MatchAny: *match == "any"}
	if len(hdrs) > 0 {
		b.Headers = hdrs
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	var changed bool
	if unbind {
		changed, err = c.Unbind(ctx, b)
	} else {
		changed, err = c.Bind(ctx, b)
	}
	if err != nil {
		return cliOneLine(err)
	}
	what := fmt.Sprintf("%s -> %s", *ex, bindingDest(b))
	if *key != "" {
		what += fmt.Sprintf(" key %q", *key)
	}
	if len(hdrs) > 0 {
		what += " headers " + headersText(b)
	}
	switch {
	case unbind && changed:
		fmt.Fprintf(io.out, "unbound %s\n", what)
	case unbind:
		fmt.Fprintf(io.out, "no binding %s\n", what)
	case changed:
		fmt.Fprintf(io.out, "bound %s\n", what)
	default:
		fmt.Fprintf(io.out, "already bound %s\n", what)
	}
	return nil
}

// publishCmd runs "herald publish": each stdin line is published as one
// record (one publish), or --count synthetic records, --batch at a time.
func publishCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("publish", io.err)
	ex := fs.String("exchange", "", "the exchange (\"\": the default exchange, where each topic is bound under its own name)")
	rkey := fs.String("routing-key", "", "the routing key")
	key := fs.String("key", "", "record key (the partition within each topic is its hash)")
	hdrs := headerFlags{}
	fs.Var(hdrs, "header", "record header NAME=VALUE (repeat for more)")
	mandatory := fs.Bool("mandatory", false, "fail (UNROUTABLE) when no binding takes a record, instead of dropping it")
	idempotent := fs.Bool("idempotent", false, "publish idempotently: a publish sent again after a lost answer is stored once")
	count := fs.Int("count", 0, "publish N synthetic records instead of reading stdin")
	size := fs.Int("size", 100, "value size in bytes of synthetic records (--count)")
	batch := fs.Int("batch", 1, "records per publish (--count)")
	maxLine := fs.Int("max-line-bytes", 1<<20, "longest stdin line accepted")
	if err := parseCLIFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *count < 0 || *size < 0:
		return usagef("--count and --size must not be negative")
	case *batch < 1:
		return usagef("--batch must be at least 1")
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	newMsg := func(v []byte) *client.Message {
		m := &client.Message{Value: v}
		if *key != "" {
			m.Key = []byte(*key)
		}
		for _, k := range slices.Sorted(maps.Keys(hdrs)) {
			m.Headers = append(m.Headers, client.Header{Key: k, Value: []byte(hdrs[k])})
		}
		return m
	}
	opt := client.PublishOptions{Mandatory: *mandatory, Idempotent: *idempotent}
	if *count > 0 {
		records, copies, dropped := 0, 0, 0
		value := make([]byte, *size)
		for records < *count {
			n := min(*batch, *count-records)
			msgs := make([]*client.Message, n)
			for i := range msgs {
				msgs[i] = newMsg(value)
			}
			r, err := c.Publish(ctx, *ex, *rkey, opt, msgs...)
			if err != nil {
				return cliOneLine(fmt.Errorf("after %d records: %w", records, err))
			}
			records += n
			dropped += r.Unroutable
			for _, d := range r.Destinations {
				copies += int(d.Count)
			}
		}
		fmt.Fprintf(io.out, "published %d records: %d copies stored, %d unroutable\n", records, copies, dropped)
		return nil
	}
	sc := bufio.NewScanner(io.in)
	sc.Buffer(make([]byte, 64<<10), *maxLine)
	for sc.Scan() {
		r, err := c.Publish(ctx, *ex, *rkey, opt, newMsg(slices.Clone(sc.Bytes())))
		if err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintln(io.out, publishedText(r))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading stdin: %v", err)
	}
	return nil
}

// publishedText is one publish's outcome on one line.
func publishedText(r *client.PublishResult) string {
	if len(r.Destinations) == 0 {
		return "unroutable: dropped"
	}
	var parts []string
	for _, d := range r.Destinations {
		if d.BaseOffset >= 0 {
			parts = append(parts, fmt.Sprintf("%s/%d@%d", d.Topic, d.Partition, d.BaseOffset))
		} else {
			parts = append(parts, fmt.Sprintf("%s/%d", d.Topic, d.Partition))
		}
	}
	s := "published to " + strings.Join(parts, " ")
	if r.Alternate > 0 {
		s += " (through the alternate exchange)"
	}
	return s
}
