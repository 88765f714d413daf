package report

import (
	"bytes"
	"errors"
	"image/png"
	"testing"
	"time"
)

func TestTimelineDrawsAPNG(t *testing.T) {
	var samples []Sample
	for i := range 3000 {
		at := time.Duration(i) * 10 * time.Millisecond
		ok := at < 10*time.Second || at > 12*time.Second // writes stop during the kill
		samples = append(samples, Sample{At: at, Latency: time.Duration(1+i%7) * time.Millisecond, OK: ok})
	}
	windows := []Window{{Name: "kill leader", From: 10 * time.Second, To: 12 * time.Second}, {Name: "pause", From: 20 * time.Second, To: 25 * time.Second}}
	var buf bytes.Buffer
	if err := Timeline(&buf, "leader-kill seed 1", samples, windows); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("the timeline is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 400 {
		t.Fatalf("timeline is %v, want at least 800x400", b)
	}
}

func TestTimelineWithoutSamples(t *testing.T) {
	if err := Timeline(&bytes.Buffer{}, "empty", nil, nil); !errors.Is(err, ErrNoSamples) {
		t.Fatalf("Timeline with no samples: %v, want ErrNoSamples", err)
	}
}

func TestBucket(t *testing.T) {
	secs := bucket([]Sample{
		{At: 100 * time.Millisecond, Latency: 3 * time.Millisecond, OK: true},
		{At: 900 * time.Millisecond, Latency: 1 * time.Millisecond, OK: true},
		{At: 2500 * time.Millisecond, OK: false},
	})
	if len(secs) != 3 || secs[0].ok != 2 || secs[1].ok+secs[1].failed != 0 || secs[2].failed != 1 {
		t.Fatalf("bucket = %+v", secs)
	}
	if secs[0].lat[0] != time.Millisecond || secs[0].lat[1] != 3*time.Millisecond {
		t.Fatalf("latencies not sorted: %v", secs[0].lat)
	}
}
