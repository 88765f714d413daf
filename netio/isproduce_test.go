package netio

import (
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

func encodeFrame(t testing.TB, f *heraldpb.Frame) []byte {
	b, err := proto.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIsProduce(t *testing.T) {
	part := uint32(1)
	produce := encodeFrame(t, &heraldpb.Frame{Id: 7, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: &part, Records: []byte("xyz")}}})
	fetch := encodeFrame(t, &heraldpb.Frame{Id: 8, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t"}}})
	for _, c := range []struct {
		name    string
		payload []byte
		want    bool
	}{
		{"produce", produce, true},
		{"fetch", fetch, false},
		{"empty", nil, false},
		{"id only", encodeFrame(t, &heraldpb.Frame{Id: 9}), false},
		{"truncated produce", produce[:len(produce)-1], false},
		{"produce then fetch: the last body wins", append(append([]byte{}, produce...), fetch...), false},
		{"fetch then produce", append(append([]byte{}, fetch...), produce...), true},
		{"garbage", []byte{0xff, 0xff, 0xff}, false},
	} {
		if got := isProduce(c.payload); got != c.want {
			t.Errorf("%s: isProduce = %v, want %v", c.name, got, c.want)
		}
	}
}

// FuzzIsProduce: isProduce never panics, and whenever the payload decodes
// as a Frame it agrees with the decoded body (admission defers exactly the
// frames the broker then handles as produce requests).
func FuzzIsProduce(f *testing.F) {
	part := uint32(0)
	f.Add(encodeFrame(f, &heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: &part, Records: []byte("r")}}}))
	f.Add(encodeFrame(f, &heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t"}}}))
	f.Fuzz(func(t *testing.T, payload []byte) {
		got := isProduce(payload)
		var fr heraldpb.Frame
		if err := proto.Unmarshal(payload, &fr); err != nil {
			return
		}
		_, want := fr.Body.(*heraldpb.Frame_Produce)
		if got != want {
			t.Fatalf("isProduce = %v, decoded body %T", got, fr.Body)
		}
	})
}
