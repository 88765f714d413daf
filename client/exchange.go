package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Exchanges route published messages to topics, as RabbitMQ's route them
// to queues (docs/routing.md). Their types are heraldpb.ExchangeType:
// EXCHANGE_DIRECT, EXCHANGE_TOPIC, EXCHANGE_FANOUT, EXCHANGE_HEADERS.

// DeclareExchange declares an exchange; declaring one that exists the same
// way is a no-op (created false), another way an INVALID_REQUEST error.
// alternate names the exchange that gets what this one cannot route ("":
// none).
func (c *Client) DeclareExchange(ctx context.Context, name string, typ heraldpb.ExchangeType, alternate string) (created bool, err error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_DeclareExchange{DeclareExchange: &heraldpb.DeclareExchangeRequest{
		Exchange: &heraldpb.ExchangeConfig{Name: name, Type: typ, Alternate: alternate},
	}}})
	if err != nil {
		return false, err
	}
	r := f.GetDeclareExchangeResponse()
	if r == nil {
		return false, unexpected(f, "DeclareExchangeResponse")
	}
	return r.Created, nil
}

// DeleteExchange deletes an exchange with its bindings and the bindings
// to it; with ifUnused, only when it has no bindings.
func (c *Client) DeleteExchange(ctx context.Context, name string, ifUnused bool) error {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_DeleteExchange{DeleteExchange: &heraldpb.DeleteExchangeRequest{Name: name, IfUnused: ifUnused}}})
	if err != nil {
		return err
	}
	if f.GetDeleteExchangeResponse() == nil {
		return unexpected(f, "DeleteExchangeResponse")
	}
	return nil
}

// Bind adds a binding from b.Exchange to a topic (b.Topic) or another
// exchange (b.ToExchange), with a routing key or pattern (b.Key), or
// headers to match (b.Headers, b.MatchAny) for a headers exchange. It
// reports false when the binding was there already.
func (c *Client) Bind(ctx context.Context, b *heraldpb.Binding) (changed bool, err error) {
	return c.bind(ctx, b, false)
}

// Unbind removes a binding (the same fields as Bind); false when it was
// not there.
func (c *Client) Unbind(ctx context.Context, b *heraldpb.Binding) (changed bool, err error) {
	return c.bind(ctx, b, true)
}

func (c *Client) bind(ctx context.Context, b *heraldpb.Binding, unbind bool) (bool, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_Bind{Bind: &heraldpb.BindRequest{Binding: b, Unbind: unbind}}})
	if err != nil {
		return false, err
	}
	r := f.GetBindResponse()
	if r == nil {
		return false, unexpected(f, "BindResponse")
	}
	return r.Changed, nil
}

// ListExchanges returns the exchanges (or the one named) with their
// bindings and the answering node's counts.
func (c *Client) ListExchanges(ctx context.Context, name string) ([]*heraldpb.ExchangeInfo, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListExchanges{ListExchanges: &heraldpb.ListExchangesRequest{Name: name}}})
	if err != nil {
		return nil, err
	}
	r := f.GetListExchangesResponse()
	if r == nil {
		return nil, unexpected(f, "ListExchangesResponse")
	}
	return r.Exchanges, nil
}

// PublishOptions are a publish's options.
type PublishOptions struct {
	// Mandatory: a publish whose records no binding takes (none through
	// the alternate exchange either) fails with UNROUTABLE and stores
	// nothing; otherwise those records are dropped and counted.
	Mandatory bool
	// Idempotent: the publish carries the client's publisher id and next
	// sequence, and is sent again after a lost connection or a timeout;
	// the broker stores it at most once on each destination (a retry of a
	// publish it decided is answered Duplicate). The client's idempotent
	// publishes go one at a time.
	Idempotent bool
}

// PublishResult is where a publish went.
type PublishResult struct {
	// Each partition that stored records of the publish. BaseOffset is -1
	// when the broker answered at the decision, before the appends (a
	// publish to several partitions whose appends took long).
	Destinations []*heraldpb.PublishedTo
	// Records no binding took, dropped (not Mandatory).
	Unroutable int
	// Records routed through an alternate exchange.
	Alternate int
	// Duplicate: an idempotent publish the broker had decided already
	// (sent again after a lost answer); nothing was stored again.
	Duplicate bool
}

// publisher is a client's idempotent publishing state: an id and the
// next sequence, one publish at a time.
type publisher struct {
	mu  sync.Mutex
	id  uint64
	seq int64
}

// ErrNoMessages is returned by Publish without messages.
var ErrNoMessages = errors.New("herald: publish without messages")

// Publish publishes msgs through exchange with routingKey, as one
// decision: every topic the bindings match stores its records, or the
// publish fails and none does. The empty exchange is the default one,
// where each topic is bound under its own name. Within a topic, the
// partition is the first message's key hash, else round robin, as for a
// produce (Message.Topic and Message.Partition are ignored).
func (c *Client) Publish(ctx context.Context, exchange, routingKey string, opt PublishOptions, msgs ...*Message) (*PublishResult, error) {
	if len(msgs) == 0 {
		return nil, ErrNoMessages
	}
	if !utf8.ValidString(exchange) || !utf8.ValidString(routingKey) {
		return nil, errors.New("herald: publish: the exchange and the routing key must be valid UTF-8")
	}
	bp := publishBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 4<<20 {
			publishBufs.Put(bp)
		}
	}()
	records := (*bp)[:0]
	for _, m := range msgs {
		var err error
		if records, err = encodeRecord(records, m); err != nil {
			return nil, err
		}
	}
	*bp = records
	req := &heraldpb.PublishRequest{Exchange: exchange, RoutingKey: routingKey, Mandatory: opt.Mandatory}
	if t := c.cfg.requestTimeout; t > 0 {
		req.TimeoutMs = uint32(t / time.Millisecond)
	}
	p := &c.publisher
	if opt.Idempotent {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.id == 0 {
			p.id = randomPublisherID()
		}
		req.ProducerId, req.Sequence = p.id, p.seq
	}
	// Through the transaction coordinator's node when known: a publish
	// that reaches several partitions, or an idempotent one, is decided
	// there.
	var f *heraldpb.Frame
	var err error
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		f, err = c.callTxnEnc(ctx, func(dst []byte, id uint64) ([]byte, error) {
			return appendPublishFrame(dst, id, req, records), nil
		}, opt.Idempotent)
		// A publish to one partition is a produce on the broker: refused
		// by a replica that no longer leads (an election), nothing was
		// written; sent again as a producer would.
		var he *Error
		if !errors.As(err, &he) || he.Code != heraldpb.ErrorCode_NOT_LEADER || he.OutcomeUnknown || sleepCtx(ctx, pause) != nil {
			break
		}
	}
	if opt.Idempotent {
		switch {
		case err == nil:
			p.seq++
		case errors.Is(err, ErrOutcomeUnknown):
			// Maybe decided: the next publish must not look like its
			// retry, so the publisher starts again under a new id.
			p.id, p.seq = randomPublisherID(), 0
		}
	}
	if err != nil {
		return nil, err
	}
	r := f.GetPublishResponse()
	if r == nil {
		return nil, unexpected(f, "PublishResponse")
	}
	return &PublishResult{Destinations: r.Destinations, Unroutable: int(r.Unroutable), Alternate: int(r.Alternate), Duplicate: r.Duplicate}, nil
}

// publishBufs recycles Publish's record buffers (those up to 4 MiB).
var publishBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// fieldFramePublish is Frame.publish's field number.
const fieldFramePublish protowire.Number = 98

// appendPublishFrame appends the length-prefixed Frame{id, publish: req
// with records} to dst, byte for byte what heraldpb.AppendFrame gives
// (req.Records and req.Routed unset), copying the records once.
func appendPublishFrame(dst []byte, id uint64, req *heraldpb.PublishRequest, records []byte) []byte {
	body := 0
	str := func(n int) int {
		if n == 0 {
			return 0
		}
		return 1 + protowire.SizeBytes(n)
	}
	vint := func(v uint64) int {
		if v == 0 {
			return 0
		}
		return 1 + protowire.SizeVarint(v)
	}
	body += str(len(req.Exchange)) + str(len(req.RoutingKey)) + str(len(records))
	if req.Mandatory {
		body += 2
	}
	body += vint(uint64(req.TimeoutMs)) + vint(req.ProducerId) + vint(uint64(req.Sequence))
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	if id != 0 {
		dst = protowire.AppendTag(dst, fieldFrameID, protowire.VarintType)
		dst = protowire.AppendVarint(dst, id)
	}
	dst = protowire.AppendTag(dst, fieldFramePublish, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(body))
	bytesField := func(num protowire.Number, b []byte) {
		if len(b) > 0 {
			dst = protowire.AppendTag(dst, num, protowire.BytesType)
			dst = protowire.AppendBytes(dst, b)
		}
	}
	varintField := func(num protowire.Number, v uint64) {
		if v != 0 {
			dst = protowire.AppendTag(dst, num, protowire.VarintType)
			dst = protowire.AppendVarint(dst, v)
		}
	}
	if req.Exchange != "" {
		dst = protowire.AppendTag(dst, 1, protowire.BytesType)
		dst = protowire.AppendString(dst, req.Exchange)
	}
	if req.RoutingKey != "" {
		dst = protowire.AppendTag(dst, 2, protowire.BytesType)
		dst = protowire.AppendString(dst, req.RoutingKey)
	}
	bytesField(3, records)
	if req.Mandatory {
		varintField(4, 1)
	}
	varintField(5, uint64(req.TimeoutMs))
	varintField(6, req.ProducerId)
	varintField(7, uint64(req.Sequence))
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-heraldpb.HeaderLen))
	return dst
}

// randomPublisherID is a new idempotent publisher id (never 0).
func randomPublisherID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])>>1 | 1
}
