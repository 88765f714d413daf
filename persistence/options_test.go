package persistence

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseFlushPolicy(t *testing.T) {
	for in, want := range map[string]FlushPolicy{
		"always":        {},
		"interval:50ms": {Interval: 50 * time.Millisecond},
		"interval:2m0s": {Interval: 2 * time.Minute},
		"interval:1.5s": {Interval: 1500 * time.Millisecond},
	} {
		got, err := ParseFlushPolicy(in)
		if err != nil || got != want {
			t.Errorf("ParseFlushPolicy(%q) = %v, %v", in, got, err)
		}
		if again, _ := ParseFlushPolicy(got.String()); again != got {
			t.Errorf("String round trip of %q: %q", in, got.String())
		}
	}
	for _, in := range []string{"", "never", "interval:", "interval:abc", "interval:-1s", "interval:0s", "Always"} {
		_, err := ParseFlushPolicy(in)
		var fe *FlushPolicyError
		if !errors.As(err, &fe) || fe.Input != in || !strings.Contains(err.Error(), "flush policy") {
			t.Errorf("ParseFlushPolicy(%q) err = %v", in, err)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	o := Options{SegmentBytes: -1, IndexIntervalBytes: -2, Flush: FlushPolicy{Interval: -1}}
	o.EnsureDefaults()
	err := o.Validate()
	for _, want := range []string{"Dir", "SegmentBytes", "IndexIntervalBytes", "Flush.Interval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate does not report %s: %v", want, err)
		}
	}
	if _, err := Open(Options{}); err == nil {
		t.Error("Open without Dir succeeded")
	}
}
