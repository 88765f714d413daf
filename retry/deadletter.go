package retry

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Headers a dead-lettered message carries, naming where it came from and
// why it was given up. `herald dlq redrive` reads them to send the message
// back, and strips them.
const (
	HeaderDLQTopic      = "herald-dlq-topic"
	HeaderDLQPartition  = "herald-dlq-partition"
	HeaderDLQOffset     = "herald-dlq-offset"
	HeaderDLQDeliveries = "herald-dlq-deliveries"
	HeaderDLQReason     = "herald-dlq-reason"
	HeaderDLQTime       = "herald-dlq-time" // RFC 3339, UTC, milliseconds
)

// DLQSuffix makes a group's default dead-letter topic: "<group>.dlq".
const DLQSuffix = ".dlq"

// DeadLetterTopic is the dead-letter topic of group: override if set,
// else group + DLQSuffix.
func DeadLetterTopic(group, override string) string {
	if override != "" {
		return override
	}
	return group + DLQSuffix
}

// Origin is where a dead-lettered message came from, and why.
type Origin struct {
	Topic      string
	Partition  uint32
	Offset     int64
	Deliveries int
	Reason     string
	Time       time.Time
}

// ErrNotDeadLetter marks a record without valid dead-letter headers.
var ErrNotDeadLetter = errors.New("herald: not a dead-lettered record")

// DeadLetter returns a copy of rec for the dead-letter topic: the same key,
// value, tags and headers (any earlier dead-letter headers replaced), plus
// the headers naming o. rec is not modified.
func DeadLetter(rec *heraldpb.Record, o Origin) *heraldpb.Record {
	out := &heraldpb.Record{Key: rec.GetKey(), Value: rec.GetValue(), Tags: rec.GetTags(), TimestampMs: rec.GetTimestampMs()}
	for _, h := range rec.GetHeaders() {
		if !isDLQHeader(h.Key) {
			out.Headers = append(out.Headers, h)
		}
	}
	add := func(k, v string) { out.Headers = append(out.Headers, &heraldpb.Header{Key: k, Value: []byte(v)}) }
	add(HeaderDLQTopic, o.Topic)
	add(HeaderDLQPartition, strconv.FormatUint(uint64(o.Partition), 10))
	add(HeaderDLQOffset, strconv.FormatInt(o.Offset, 10))
	add(HeaderDLQDeliveries, strconv.Itoa(o.Deliveries))
	add(HeaderDLQReason, o.Reason)
	add(HeaderDLQTime, o.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	return out
}

func isDLQHeader(k string) bool { return strings.HasPrefix(k, "herald-dlq-") }

// OriginOf reads the dead-letter headers of rec. Errors wrap
// ErrNotDeadLetter and name the header that is missing or malformed.
func OriginOf(rec *heraldpb.Record) (Origin, error) {
	get := map[string]string{}
	for _, h := range rec.GetHeaders() {
		if isDLQHeader(h.Key) {
			if _, dup := get[h.Key]; !dup {
				get[h.Key] = string(h.Value)
			}
		}
	}
	var o Origin
	bad := func(k string, err error) (Origin, error) {
		if v, ok := get[k]; ok {
			return Origin{}, fmt.Errorf("%w: header %s=%q: %v", ErrNotDeadLetter, k, v, err)
		}
		return Origin{}, fmt.Errorf("%w: header %s missing", ErrNotDeadLetter, k)
	}
	var ok bool
	if o.Topic, ok = get[HeaderDLQTopic]; !ok || o.Topic == "" {
		return bad(HeaderDLQTopic, errors.New("empty"))
	}
	p, err := strconv.ParseUint(get[HeaderDLQPartition], 10, 32)
	if err != nil {
		return bad(HeaderDLQPartition, err)
	}
	o.Partition = uint32(p)
	if o.Offset, err = strconv.ParseInt(get[HeaderDLQOffset], 10, 64); err != nil || o.Offset < 0 {
		return bad(HeaderDLQOffset, cmpErr(err, "negative"))
	}
	// 0 is a message whose time-to-live ran out before its first delivery.
	if o.Deliveries, err = strconv.Atoi(get[HeaderDLQDeliveries]); err != nil || o.Deliveries < 0 {
		return bad(HeaderDLQDeliveries, cmpErr(err, "negative"))
	}
	o.Reason = get[HeaderDLQReason]
	if o.Time, err = time.Parse(time.RFC3339Nano, get[HeaderDLQTime]); err != nil {
		return bad(HeaderDLQTime, err)
	}
	return o, nil
}

func cmpErr(err error, otherwise string) error {
	if err != nil {
		return err
	}
	return errors.New(otherwise)
}

// Redriven returns a copy of a dead-lettered rec to send back to its
// original topic: the dead-letter headers removed, the rest unchanged.
func Redriven(rec *heraldpb.Record) *heraldpb.Record {
	out := &heraldpb.Record{Key: rec.GetKey(), Value: rec.GetValue(), Tags: rec.GetTags(), TimestampMs: rec.GetTimestampMs()}
	for _, h := range rec.GetHeaders() {
		if !isDLQHeader(h.Key) {
			out.Headers = append(out.Headers, h)
		}
	}
	return out
}
