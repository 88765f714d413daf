package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
)

// ErrorHeader is the header of an error reply: Respond sets it to the text
// of its function's error, and Request turns a reply carrying it into a
// *ResponderError.
const ErrorHeader = "herald-error"

// ResponderError is returned by Request when the reply carries ErrorHeader:
// the responder's function failed with Message. It is not retryable.
type ResponderError struct {
	Message string
}

func (e *ResponderError) Error() string { return "herald: responder failed: " + e.Message }

// callWaiter waits for the reply to one Request. Waiters are recycled: a
// waiter goes back to the pool only when it is not registered and its
// channel is empty (see conn.push and conn.fail, which send under the
// connection's lock).
type callWaiter struct {
	ch    chan *heraldpb.ReplyDelivery // the reply, or nil when the connection dies
	timer *time.Timer
}

var callWaiters = sync.Pool{New: func() any {
	return &callWaiter{ch: make(chan *heraldpb.ReplyDelivery, 1)}
}}

// release unregisters w from cn and recycles it.
func (w *callWaiter) release(cn *conn, corr uint64) {
	cn.removeCall(corr)
	select {
	case <-w.ch:
	default:
	}
	w.recycle()
}

func (w *callWaiter) recycle() {
	if w.timer != nil {
		w.timer.Stop()
	}
	callWaiters.Put(w)
}

// Request sends msg to one responder of each group that responds on topic
// (see Respond) and returns the first reply. msg is not written to the log.
// It fails with a NO_RESPONDERS *Error when nobody responds on the topic,
// with a *ResponderError (and the reply) when the responder's function
// failed, and with ctx.Err() when ctx ends first. The wait for the reply is
// also bounded by the client's request timeout (WithRequestTimeout):
// ErrRequestTimeout. A reply that arrives after Request returned is
// dropped. Only msg's Key, Value, Headers, Timestamp and Tags are sent.
//
// The correlation id comes from a per-client counter and is registered on
// the connection before the CallRequest is sent, so a reply cannot arrive
// unannounced; a lost connection fails the Request with ErrConnectionLost
// (the reply would go to the dead connection's inbox).
func (c *Client) Request(ctx context.Context, topic string, msg *Message) (*Message, error) {
	if topic == "" {
		return nil, errors.New("herald: request without topic")
	}
	if msg == nil {
		msg = &Message{}
	}
	for hop := 0; ; hop++ {
		cn, err := c.coordConn(ctx, &c.groups)
		if err != nil {
			return nil, err
		}
		m, err := c.requestOn(ctx, cn, topic, msg)
		if c.follow(ctx, &c.groups, err, hop) {
			continue
		}
		return m, err
	}
}

// requestOn is one Request on connection cn.
func (c *Client) requestOn(ctx context.Context, cn *conn, topic string, msg *Message) (*Message, error) {
	corr := c.corrID.Add(1)
	w := callWaiters.Get().(*callWaiter)
	if !cn.addCall(corr, w) {
		w.recycle()
		return nil, cn.deadErr()
	}
	respCh, err := cn.send(ctx, func(dst []byte, id uint64) ([]byte, error) {
		return appendCallFrame(dst, id, topic, corr, msg)
	}, nil)
	if err != nil {
		w.release(cn, corr)
		return nil, err
	}
	var timeout <-chan time.Time
	d := c.cfg.requestTimeout
	if d > 0 {
		if w.timer == nil {
			w.timer = time.NewTimer(d)
		} else {
			w.timer.Reset(d)
		}
		timeout = w.timer.C
	}
	for {
		select {
		case f := <-respCh:
			ch := respCh
			respCh = nil // answered: wait for the reply only
			f, err := cn.response(ch, f)
			if err == nil && f.GetCallResponse() == nil {
				err = unexpected(f, "CallResponse")
			}
			if err != nil {
				w.release(cn, corr)
				return nil, err
			}
		case rd := <-w.ch:
			w.recycle() // unregistered by the sender; channel empty again
			if rd == nil {
				return nil, cn.deadErr()
			}
			m := &Message{Topic: topic, Partition: -1, Offset: -1}
			recordToMessage(m, rd.GetRecord(), 0)
			for _, h := range m.Headers {
				if h.Key == ErrorHeader {
					return m, &ResponderError{Message: string(h.Value)}
				}
			}
			return m, nil
		case <-ctx.Done():
			w.release(cn, corr)
			return nil, ctx.Err()
		case <-timeout:
			w.release(cn, corr)
			if respCh != nil {
				return nil, cn.timedOut(d) // not even the CallResponse came
			}
			return nil, fmt.Errorf("%w: no reply to a request on %q within %s", ErrRequestTimeout, topic, d)
		}
	}
}

// Reply answers req, a request delivered to a responder subscription, with
// reply (nil = an empty reply). It is sent on the connection req came on
// while that lives. It returns once the broker has passed the reply on; an
// INBOX_NOT_FOUND *Error means the caller is gone.
func (c *Client) Reply(ctx context.Context, req *Delivered, reply *Message) error {
	wait, err := c.sendReply(ctx, req, reply)
	if err != nil {
		return err
	}
	return wait()
}

// sendReply writes the ReplyRequest for req (on the calling goroutine when
// the connection is idle: no handoff before the reply leaves) and returns
// the function that waits for the broker's answer.
func (c *Client) sendReply(ctx context.Context, req *Delivered, reply *Message) (wait func() error, err error) {
	if req == nil || req.ReplyInbox == "" {
		return nil, ErrNotRequest
	}
	if reply == nil {
		reply = &Message{}
	}
	var cn *conn
	if req.sess != nil && req.sess.cn.alive() {
		cn = req.sess.cn
	} else if cn, err = c.anyConn(ctx); err != nil {
		return nil, err
	}
	ch, err := cn.send(ctx, func(dst []byte, id uint64) ([]byte, error) {
		return appendReplyFrame(dst, id, req.ReplyInbox, req.CorrelationID, reply)
	}, nil)
	if err != nil {
		return nil, err
	}
	timeout := c.cfg.requestTimeout
	return func() error {
		var timer <-chan time.Time
		if timeout > 0 {
			t := time.NewTimer(timeout)
			defer t.Stop()
			timer = t.C
		}
		var f *heraldpb.Frame
		select {
		case f = <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-timer:
			return cn.timedOut(timeout)
		}
		f, err := cn.response(ch, f)
		if err != nil {
			return err
		}
		if f.GetReplyResponse() == nil {
			return unexpected(f, "ReplyResponse")
		}
		return nil
	}, nil
}

// RespondFunc answers one request. Its error is sent to the caller as an
// error reply (see ErrorHeader).
type RespondFunc func(ctx context.Context, req *Delivered) (*Message, error)

// Respond subscribes to topic as a responder of group: Subscribe with Mode
// Shared, Responder and AutoAck set (opts may change the other options,
// e.g. Concurrency or OnError). fn is called for each request and its
// result sent with Reply; an error becomes a reply with ErrorHeader set to
// the error's text (fn's message, if any, is sent along). Records produced
// to the topic are delivered to fn too, and its result is then dropped.
// Failed replies are reported to OnError. Close the subscription to stop
// responding.
//
// group is a consumer group like any other: after the last responder
// closes, it stays listed (`herald group list`) with its progress in
// `__groups`, its coordinator stops after the broker's --group-idle-stop,
// and the next Respond or Subscribe with the same group resumes it. Use
// one group per service, not one per process, so that groups do not pile
// up.
func (c *Client) Respond(ctx context.Context, topic, group string, fn RespondFunc, opts ...func(*SubscribeOptions)) (*Subscription, error) {
	if fn == nil {
		return nil, errors.New("herald: respond: nil function")
	}
	o := SubscribeOptions{Topic: topic, Group: group}
	for _, f := range opts {
		f(&o)
	}
	o.Mode, o.Responder, o.AutoAck = Shared, true, true
	report := o.OnError
	// Replies go out without the handler waiting for the broker's answer
	// (one round trip per call would bound a responder to one call per
	// RTT); at most respondAsyncMax are unanswered at once.
	sem := make(chan struct{}, respondAsyncMax)
	return c.Subscribe(ctx, o, func(ctx context.Context, d *Delivered) {
		reply, err := fn(ctx, d)
		if !d.IsRequest() {
			return
		}
		if err != nil {
			var r Message
			if reply != nil {
				r = *reply
			}
			r.Headers = append(r.Headers[:len(r.Headers):len(r.Headers)], Header{Key: ErrorHeader, Value: []byte(err.Error())})
			reply = &r
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		// The reply leaves from this goroutine; its answer is awaited in
		// another, off the call's path.
		wait, err := c.sendReply(ctx, d, reply)
		if err != nil {
			<-sem
			if report != nil {
				report(fmt.Errorf("herald: reply on %s: %w", topic, err))
			}
			return
		}
		go func() {
			defer func() { <-sem }()
			if err := wait(); err != nil && report != nil {
				report(fmt.Errorf("herald: reply on %s: %w", topic, err))
			}
		}()
	})
}

// respondAsyncMax bounds the replies a Respond subscription has sent and
// not yet seen answered.
const respondAsyncMax = 1024

// Field numbers of the hand-encoded requests (proto/herald.proto).
const (
	fieldFrameID    protowire.Number = 1
	fieldFrameCall  protowire.Number = 44 // Frame.call: CallRequest{topic 1, record 2, correlation_id 3}
	fieldFrameReply protowire.Number = 46 // Frame.reply: ReplyRequest{inbox 1, correlation_id 2, record 3}
)

// appendCallFrame appends the length-prefixed Frame{id, call:
// CallRequest{topic, record: m, correlation_id: corr}} to dst, byte for
// byte what heraldpb.AppendFrame gives, without building the protobuf
// structs. On error dst is returned unchanged.
func appendCallFrame(dst []byte, id uint64, topic string, corr uint64, m *Message) ([]byte, error) {
	return appendRecordFrame(dst, id, fieldFrameCall, topic, 3, corr, 2, m)
}

// appendReplyFrame appends Frame{id, reply: ReplyRequest{inbox,
// correlation_id: corr, record: m}} as appendCallFrame does.
func appendReplyFrame(dst []byte, id uint64, inbox string, corr uint64, m *Message) ([]byte, error) {
	return appendRecordFrame(dst, id, fieldFrameReply, inbox, 2, corr, 3, m)
}

// maxHead bounds the bytes before a request's record other than its
// string: length prefix, id, body tag and length, string tag and length,
// correlation id.
const maxHead = heraldpb.HeaderLen + (1 + binary.MaxVarintLen64) + (2 + binary.MaxVarintLen64) + (1 + binary.MaxVarintLen64) + (1 + binary.MaxVarintLen64)

// appendRecordFrame appends a frame whose body (field bodyField) is a
// message of a string (field 1), a varint (field corrField) and a record
// (field recField), fields in number order and proto3 defaults omitted.
// The record is encoded first, behind room for the longest possible head;
// once its size is known the head is written and the record moved down.
func appendRecordFrame(dst []byte, id uint64, bodyField protowire.Number, str string, corrField protowire.Number, corr uint64, recField protowire.Number, m *Message) ([]byte, error) {
	if !utf8.ValidString(str) {
		return dst, errors.New("herald: topic or inbox: string field contains invalid UTF-8")
	}
	start := len(dst)
	dst = append(dst, make([]byte, maxHead+len(str))...)
	recStart := len(dst)
	dst, err := encodeRecord(dst, m)
	if err != nil {
		return dst[:start], err
	}
	// encodeRecord wrote the record as RecordBatch field 1; renumber it.
	dst[recStart] = byte(protowire.EncodeTag(recField, protowire.BytesType))
	recLen := len(dst) - recStart

	var cb [1 + binary.MaxVarintLen64]byte
	cf := cb[:0]
	if corr != 0 {
		cf = protowire.AppendTag(cf, corrField, protowire.VarintType)
		cf = protowire.AppendVarint(cf, corr)
	}
	bodyLen := recLen + len(cf)
	if str != "" {
		bodyLen += 1 + protowire.SizeBytes(len(str))
	}
	var hb [maxHead]byte
	h := append(hb[:0], 0, 0, 0, 0)
	if id != 0 {
		h = protowire.AppendTag(h, fieldFrameID, protowire.VarintType)
		h = protowire.AppendVarint(h, id)
	}
	h = protowire.AppendTag(h, bodyField, protowire.BytesType)
	h = protowire.AppendVarint(h, uint64(bodyLen))
	if str != "" {
		h = protowire.AppendTag(h, 1, protowire.BytesType)
		h = protowire.AppendVarint(h, uint64(len(str)))
	}
	corrFirst := corrField < recField
	headLen := len(h) + len(str)
	if corrFirst {
		headLen += len(cf)
	}
	copy(dst[start+headLen:], dst[recStart:])
	n := start + copy(dst[start:], h)
	n += copy(dst[n:], str)
	if corrFirst {
		copy(dst[n:], cf)
	}
	dst = dst[:start+headLen+recLen]
	if !corrFirst {
		dst = append(dst, cf...)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-heraldpb.HeaderLen))
	return dst, nil
}
