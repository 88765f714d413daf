package heraldpb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// FuzzFrame feeds arbitrary bytes to the server's read path, SplitFrame then
// DecodeFrame, with a small limit so the too-large path is reached too. It
// guarantees: neither panics; SplitFrame never returns a payload other than
// the declared length, nor one above the limit; DecodeFrame returns a frame
// exactly when the payload parses; and a decoded frame re-encoded with
// AppendFrame decodes to an equal frame.
func FuzzFrame(f *testing.F) {
	const limit = 1 << 12
	f.Fuzz(func(t *testing.T, buf []byte) {
		payload, n, err := SplitFrame(buf, limit)
		switch {
		case errors.Is(err, ErrIncomplete):
			if len(buf) >= HeaderLen && HeaderLen+int(binary.BigEndian.Uint32(buf)) <= len(buf) {
				t.Fatalf("ErrIncomplete with a whole frame buffered")
			}
			return
		case errors.Is(err, ErrFrameTooLarge):
			if binary.BigEndian.Uint32(buf) <= limit {
				t.Fatalf("ErrFrameTooLarge for a declared length within the limit")
			}
			return
		case err != nil:
			t.Fatalf("unexpected error %v", err)
		}
		declared := int(binary.BigEndian.Uint32(buf))
		if len(payload) != declared || n != HeaderLen+declared || declared > limit {
			t.Fatalf("payload %d bytes, n %d, declared %d", len(payload), n, declared)
		}
		fr, err := DecodeFrame(payload)
		if errors.Is(err, ErrMalformed) {
			if fr != nil {
				t.Fatal("frame returned with ErrMalformed")
			}
			return
		}
		if fr == nil {
			t.Fatalf("nil frame with err %v", err)
		}
		if errors.Is(err, ErrUnknownBody) != (fr.Body == nil) {
			t.Fatalf("err %v with body %v", err, fr.Body)
		}
		enc, err2 := AppendFrame([]byte{0xAA}, fr)
		if err2 != nil {
			t.Fatalf("re-encode: %v", err2)
		}
		if enc[0] != 0xAA {
			t.Fatal("AppendFrame overwrote dst")
		}
		p2, n2, err2 := SplitFrame(enc[1:], 1<<30)
		if err2 != nil || n2 != len(enc)-1 {
			t.Fatalf("split re-encoded: n %d of %d, %v", n2, len(enc)-1, err2)
		}
		fr2, err2 := DecodeFrame(p2)
		if (err == nil) != (err2 == nil) || !proto.Equal(fr, fr2) {
			t.Fatalf("round trip changed the frame:\n%v (%v)\n%v (%v)", fr, err, fr2, err2)
		}
	})
}

// FuzzRecordBatch checks ScanBatch against the generated decoder. It
// guarantees: ScanBatch never panics; whatever it accepts, proto.Unmarshal
// accepts too (the broker never stores a batch its clients cannot decode),
// with the same record count, first key and timestamps; and whatever
// proto.Unmarshal accepts with only known fields and no negative timestamp
// (ScanBatch's one extra rule), ScanBatch accepts with Count ==
// len(Records).
func FuzzRecordBatch(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		info, scanErr := ScanBatch(b)
		if scanErr != nil && !errors.Is(scanErr, ErrBadBatch) {
			t.Fatalf("error not marked ErrBadBatch: %v", scanErr)
		}
		var rb RecordBatch
		unmErr := proto.Unmarshal(b, &rb)
		if scanErr == nil {
			if unmErr != nil {
				t.Fatalf("ScanBatch accepted a batch proto.Unmarshal rejects: %v", unmErr)
			}
			checkInfo(t, info, &rb)
			return
		}
		if unmErr != nil || hasUnknown(rb.ProtoReflect()) {
			return
		}
		for _, r := range rb.Records {
			if r.TimestampMs < 0 {
				return
			}
		}
		t.Fatalf("ScanBatch rejected a clean batch of %d records: %v", len(rb.Records), scanErr)
	})
}

func checkInfo(t *testing.T, info BatchInfo, rb *RecordBatch) {
	t.Helper()
	if info.Count != len(rb.Records) {
		t.Fatalf("Count %d, len(Records) %d", info.Count, len(rb.Records))
	}
	var minTS, maxTS int64
	for _, r := range rb.Records {
		if ts := r.TimestampMs; ts != 0 {
			if minTS == 0 || ts < minTS {
				minTS = ts
			}
			maxTS = max(maxTS, ts)
		}
	}
	if info.MinTimestamp != minTS || info.MaxTimestamp != maxTS {
		t.Fatalf("timestamps [%d, %d], want [%d, %d]", info.MinTimestamp, info.MaxTimestamp, minTS, maxTS)
	}
	if len(rb.Records) > 0 && !bytes.Equal(info.FirstKey, rb.Records[0].Key) {
		t.Fatalf("FirstKey %x, want %x", info.FirstKey, rb.Records[0].Key)
	}
}

// hasUnknown reports whether m or any message inside it kept unknown fields.
func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && !found; i++ {
				found = hasUnknown(l.Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			found = hasUnknown(v.Message())
		}
		return !found
	})
	return found
}
