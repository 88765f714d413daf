// Package exchange routes published messages the way RabbitMQ's exchanges
// do: it compiles the exchanges and bindings of the metadata into a Table
// that answers, for an exchange, a routing key and a record's headers,
// which topics get a copy. It also holds the changes to that metadata
// (declare, delete, bind, unbind) as pure functions, shared by the
// controller (a cluster) and a single node's file.
//
// It belongs to the shared layer: it imports only proto.
package exchange

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Limits of the metadata. Routing is indexed (a map for direct
// exchanges, a trie over words for topic exchanges), so a large number of
// bindings costs memory, not time per message.
const (
	MaxExchanges = 4096
	// MaxBindings bounds the bindings of all exchanges together, and
	// MaxBindingBytes their encoded size (keys and headers), so that the
	// metadata every node holds, and the controller's checkpoint of it,
	// stay small.
	MaxBindings     = 100_000
	MaxBindingBytes = 16 << 20
	// MaxKeyBytes bounds a routing key and a binding's key or pattern, as
	// RabbitMQ's 255-byte short string does.
	MaxKeyBytes = 255
	// MaxBindingHeaders bounds a headers binding's headers.
	MaxBindingHeaders = 32
	// MaxHeaderBytes bounds one binding header's name plus value.
	MaxHeaderBytes = 1024
)

var validName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// ValidName reports whether name may name an exchange (as a topic name
// may: 1-249 characters of A-Z a-z 0-9 . _ -). The default exchange has
// the empty name and cannot be declared.
func ValidName(name string) bool {
	return validName.MatchString(name) && name != "." && name != ".."
}

func invalid(format string, args ...any) *heraldpb.Error {
	return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...)
}

func notFound(name string) *heraldpb.Error {
	return heraldpb.NewError(heraldpb.ErrorCode_EXCHANGE_NOT_FOUND, "exchange %q does not exist", name)
}

// CheckConfig refuses an exchange no store accepts. name is the broker's
// name (a vhost's exchange is V~NAME: the part after the separator is
// checked).
func CheckConfig(c *heraldpb.ExchangeConfig) *heraldpb.Error {
	if c == nil {
		return invalid("declare exchange: no exchange")
	}
	if !ValidName(local(c.Name)) {
		return invalid("exchange name %q: must be 1-249 characters of A-Z a-z 0-9 . _ - (the default exchange \"\" is built in)", cut(c.Name))
	}
	if c.Type < heraldpb.ExchangeType_EXCHANGE_DIRECT || c.Type > heraldpb.ExchangeType_EXCHANGE_HEADERS {
		return invalid("exchange %q: type %d: must be direct, topic, fanout or headers", local(c.Name), c.Type)
	}
	if c.Alternate != "" && !ValidName(local(c.Alternate)) {
		return invalid("exchange %q: alternate exchange name %q is not valid", local(c.Name), cut(c.Alternate))
	}
	return nil
}

// CheckBinding refuses a binding no store accepts.
func CheckBinding(b *heraldpb.Binding) *heraldpb.Error {
	switch {
	case b == nil:
		return invalid("bind: no binding")
	case !ValidName(local(b.Exchange)):
		return invalid("bind: exchange name %q is not valid (the default exchange takes no bindings)", cut(b.Exchange))
	case (b.Topic == "") == (b.ToExchange == ""):
		return invalid("bind: name exactly one destination, a topic or an exchange")
	case b.ToExchange != "" && !ValidName(local(b.ToExchange)):
		return invalid("bind: destination exchange name %q is not valid", cut(b.ToExchange))
	case len(b.Key) > MaxKeyBytes:
		return invalid("bind: the key is %d bytes, more than %d", len(b.Key), MaxKeyBytes)
	case len(b.Headers) > MaxBindingHeaders:
		return invalid("bind: %d headers, more than %d", len(b.Headers), MaxBindingHeaders)
	}
	for k, v := range b.Headers {
		if k == "" || len(k)+len(v) > MaxHeaderBytes {
			return invalid("bind: header %q: a name of 1 byte or more, and name and value together at most %d bytes", cut(k), MaxHeaderBytes)
		}
	}
	return nil
}

// CheckRoutingKey refuses a publish's routing key no exchange accepts.
func CheckRoutingKey(key string) *heraldpb.Error {
	if len(key) > MaxKeyBytes {
		return invalid("publish: the routing key is %d bytes, more than %d", len(key), MaxKeyBytes)
	}
	return nil
}

// local is the part of a broker's name its vhost's clients see.
func local(name string) string {
	if _, n, ok := strings.Cut(name, "~"); ok {
		return n
	}
	return name
}

func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// TypeName is the CLI's name of an exchange type.
func TypeName(t heraldpb.ExchangeType) string {
	switch t {
	case heraldpb.ExchangeType_EXCHANGE_DIRECT:
		return "direct"
	case heraldpb.ExchangeType_EXCHANGE_TOPIC:
		return "topic"
	case heraldpb.ExchangeType_EXCHANGE_FANOUT:
		return "fanout"
	case heraldpb.ExchangeType_EXCHANGE_HEADERS:
		return "headers"
	}
	return fmt.Sprintf("type(%d)", t)
}

// ParseType reads an exchange type's CLI name.
func ParseType(s string) (heraldpb.ExchangeType, bool) {
	for _, t := range []heraldpb.ExchangeType{heraldpb.ExchangeType_EXCHANGE_DIRECT, heraldpb.ExchangeType_EXCHANGE_TOPIC, heraldpb.ExchangeType_EXCHANGE_FANOUT, heraldpb.ExchangeType_EXCHANGE_HEADERS} {
		if TypeName(t) == s {
			return t, true
		}
	}
	return 0, false
}

// SameBinding reports whether a and b bind the same source to the same
// destination the same way (the identity of a binding).
func SameBinding(a, b *heraldpb.Binding) bool {
	if a.Exchange != b.Exchange || a.Topic != b.Topic || a.ToExchange != b.ToExchange || a.Key != b.Key || a.MatchAny != b.MatchAny || len(a.Headers) != len(b.Headers) {
		return false
	}
	for k, v := range a.Headers {
		if w, ok := b.Headers[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Metadata is the exchanges of a store, by name. The functions below
// change it in place; a store applies them to its own copy.
type Metadata map[string]*heraldpb.ExchangeRecord

// Bindings counts the bindings of every exchange.
func (md Metadata) Bindings() int {
	n := 0
	for _, x := range md {
		n += len(x.Bindings)
	}
	return n
}

// bindingBytes is the encoded size of every binding.
func (md Metadata) bindingBytes() int {
	n := 0
	for _, x := range md {
		n += int(x.BindingBytes)
	}
	return n
}

// sizeOf is the encoded size of bindings.
func sizeOf(bs []*heraldpb.Binding) uint64 {
	n := 0
	for _, b := range bs {
		n += proto.Size(b)
	}
	return uint64(n)
}

// Declare adds rec's exchange, or checks that an existing one of the name
// is the same (created false). Errors are typed.
func (md Metadata) Declare(rec *heraldpb.ExchangeRecord) (created bool, err *heraldpb.Error) {
	if e := CheckConfig(rec.GetConfig()); e != nil {
		return false, e
	}
	c := rec.Config
	if have := md[c.Name]; have != nil {
		if have.Config.Type != c.Type || have.Config.Alternate != c.Alternate {
			return false, invalid("exchange %q exists as %s (alternate %q); delete it first to declare it as %s (alternate %q)",
				local(c.Name), TypeName(have.Config.Type), local(have.Config.Alternate), TypeName(c.Type), local(c.Alternate))
		}
		return false, nil
	}
	if len(md) >= MaxExchanges {
		return false, heraldpb.NewError(heraldpb.ErrorCode_QUOTA_EXCEEDED, "%d exchanges exist, the most a cluster holds", len(md))
	}
	md[c.Name] = &heraldpb.ExchangeRecord{Config: c, CreatedMs: rec.CreatedMs, RequestId: rec.RequestId}
	return true, nil
}

// Delete removes an exchange with its bindings, and every binding to it.
// Alternates naming it stay (they route nothing until it is declared
// again, as in RabbitMQ).
func (md Metadata) Delete(name string, ifUnused bool) *heraldpb.Error {
	x := md[name]
	if x == nil {
		return notFound(local(name))
	}
	if ifUnused && len(x.Bindings) > 0 {
		return invalid("exchange %q has %d bindings (if-unused)", local(name), len(x.Bindings))
	}
	delete(md, name)
	md.dropBindings(func(b *heraldpb.Binding) bool { return b.ToExchange == name })
	return nil
}

// dropBindings removes the bindings drop reports.
func (md Metadata) dropBindings(drop func(*heraldpb.Binding) bool) {
	for _, o := range md {
		if slices.ContainsFunc(o.Bindings, drop) {
			bs := slices.DeleteFunc(slices.Clone(o.Bindings), drop)
			md.withBindings(o, bs, sizeOf(bs))
		}
	}
}

// DeleteVhost removes the exchanges of a deleted vhost (their names
// start with prefix, the vhost's name and its separator), and every
// binding to them.
func (md Metadata) DeleteVhost(prefix string) {
	for name := range md {
		if strings.HasPrefix(name, prefix) {
			delete(md, name)
		}
	}
	md.dropBindings(func(b *heraldpb.Binding) bool { return strings.HasPrefix(b.ToExchange, prefix) })
}

// DeleteTopic removes the bindings to a deleted topic.
func (md Metadata) DeleteTopic(topic string) {
	md.dropBindings(func(b *heraldpb.Binding) bool { return b.Topic == topic })
}

// Bind adds b (changed false when it is there already) or, with unbind,
// removes it (changed false when it was not there). The caller checks
// that a destination topic exists.
func (md Metadata) Bind(b *heraldpb.Binding, unbind bool) (changed bool, err *heraldpb.Error) {
	if e := CheckBinding(b); e != nil {
		return false, e
	}
	x := md[b.Exchange]
	if x == nil {
		return false, notFound(local(b.Exchange))
	}
	i := slices.IndexFunc(x.Bindings, func(o *heraldpb.Binding) bool { return SameBinding(o, b) })
	if unbind {
		if i < 0 {
			return false, nil
		}
		md.withBindings(x, slices.Delete(slices.Clone(x.Bindings), i, i+1), x.BindingBytes-min(x.BindingBytes, uint64(proto.Size(x.Bindings[i]))))
		return true, nil
	}
	if i >= 0 {
		return false, nil
	}
	if b.ToExchange != "" && md[b.ToExchange] == nil {
		return false, notFound(local(b.ToExchange))
	}
	if n := md.Bindings(); n >= MaxBindings {
		return false, heraldpb.NewError(heraldpb.ErrorCode_QUOTA_EXCEEDED, "%d bindings exist, the most a cluster holds", n)
	}
	size := proto.Size(b)
	if total := md.bindingBytes() + size; total > MaxBindingBytes {
		return false, heraldpb.NewError(heraldpb.ErrorCode_QUOTA_EXCEEDED, "the bindings would take %d bytes, more than the %d a cluster holds", total, MaxBindingBytes)
	}
	md.withBindings(x, append(slices.Clip(x.Bindings), b), x.BindingBytes+uint64(size))
	return true, nil
}

// List is md's exchanges sorted by name.
func (md Metadata) List() []*heraldpb.ExchangeRecord {
	out := make([]*heraldpb.ExchangeRecord, 0, len(md))
	for _, n := range slices.Sorted(maps.Keys(md)) {
		out = append(out, md[n])
	}
	return out
}

// Clone is a copy of md that the functions above may change without
// changing md: they replace a changed record, never change one.
func (md Metadata) Clone() Metadata { return maps.Clone(md) }

// withBindings replaces x's record by a copy with bs, whose encoded size
// is size.
func (md Metadata) withBindings(x *heraldpb.ExchangeRecord, bs []*heraldpb.Binding, size uint64) {
	md[x.Config.Name] = &heraldpb.ExchangeRecord{Config: x.Config, Bindings: bs, CreatedMs: x.CreatedMs, RequestId: x.RequestId, BindingBytes: size}
}

// FromList is the metadata of a stored list.
func FromList(list []*heraldpb.ExchangeRecord) Metadata {
	md := make(Metadata, len(list))
	for _, x := range list {
		if x.GetConfig() != nil {
			md.withBindings(x, x.Bindings, sizeOf(x.Bindings)) // the stored size is not trusted
		}
	}
	return md
}
