package heraldpb

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// HeaderLen is the size of a frame's big-endian u32 length prefix.
const HeaderLen = 4

// ProtocolVersion is the client protocol version this build speaks.
const ProtocolVersion = 1

// DefaultMaxFrameBytes is the frame size limit before Hello negotiates one.
const DefaultMaxFrameBytes = 16 << 20

var (
	// ErrIncomplete means the buffer does not yet hold a whole frame.
	ErrIncomplete = errors.New("herald: incomplete frame")
	// ErrFrameTooLarge means a frame declares a length above the limit.
	ErrFrameTooLarge = errors.New("herald: frame too large")
	// ErrMalformed means a frame's payload is not a valid Frame.
	ErrMalformed = errors.New("herald: malformed frame")
	// ErrUnknownBody means a frame decoded but carries no body this build knows.
	ErrUnknownBody = errors.New("herald: unknown frame body")
)

// AppendFrame appends f to dst as a length-prefixed frame.
func AppendFrame(dst []byte, f *Frame) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst, err := proto.MarshalOptions{}.MarshalAppend(dst, f)
	if err != nil {
		return dst[:start], err
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-HeaderLen))
	return dst, nil
}

// SplitFrame finds the first frame in buf. It returns the payload (aliasing
// buf) and the bytes the frame occupies. It returns ErrIncomplete when more
// bytes are needed, and ErrFrameTooLarge as soon as the header declares a
// payload above max, without waiting for the payload.
func SplitFrame(buf []byte, max int) (payload []byte, n int, err error) {
	if len(buf) < HeaderLen {
		return nil, 0, ErrIncomplete
	}
	size := binary.BigEndian.Uint32(buf)
	if uint64(size) > uint64(max) {
		return nil, 0, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, size, max)
	}
	total := HeaderLen + int(size)
	if len(buf) < total {
		return nil, 0, ErrIncomplete
	}
	return buf[HeaderLen:total], total, nil
}

// DecodeFrame decodes one frame payload (without its length prefix). The
// result does not alias payload. A payload that is not a Frame gives
// ErrMalformed; a Frame with no body this build knows gives ErrUnknownBody
// together with the decoded frame, so the caller can answer its id.
func DecodeFrame(payload []byte) (*Frame, error) {
	f := &Frame{}
	if err := proto.Unmarshal(payload, f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if f.Body == nil {
		return f, ErrUnknownBody
	}
	return f, nil
}
