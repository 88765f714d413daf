package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// TestServeConfigPrecedence checks flag over environment over file over
// default, and that big JSON numbers survive.
func TestServeConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(file, []byte(`{"segment-bytes": 16777216, "listen": "127.0.0.1:1", "flush": "interval:5ms", "idle-timeout": "1m"}`), 0o644)
	c, err := loadServeConfig([]string{"--config", file, "--listen", "127.0.0.1:3"},
		env(map[string]string{"HERALD_LISTEN": "127.0.0.1:2", "HERALD_IDLE_TIMEOUT": "2m"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.SegmentBytes != 16777216 || c.Listen != "127.0.0.1:3" || c.Flush != "interval:5ms" || c.IdleTimeout != 2*time.Minute {
		t.Fatalf("got %+v", c)
	}
	if c.DataDir != "./data" || c.Admin != "127.0.0.1:7480" {
		t.Fatalf("defaults lost: %+v", c)
	}
}

// TestServeConfigErrors checks that every bad setting is named, all at
// once, and that bad values are usage errors (exit 2).
func TestServeConfigErrors(t *testing.T) {
	_, err := loadServeConfig([]string{"--listen", "nope", "--flush", "sometimes", "--max-in-flight", "0", "--log-sync-pace", "1s"}, env(nil))
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("want a usage error, got %v", err)
	}
	for _, name := range []string{`"listen"`, `"flush"`, `"max-in-flight"`, `"log-sync-pace"`} {
		if !strings.Contains(err.Error(), name) {
			t.Fatalf("error does not name setting %s: %v", name, err)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("error is not one line: %q", err)
	}
	if _, err := loadServeConfig(nil, env(map[string]string{"HERALD_IDLE_TIMEOUT": "5"})); err == nil || !strings.Contains(err.Error(), "HERALD_IDLE_TIMEOUT") {
		t.Fatalf("bad env value: %v", err)
	}
	file := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(file, []byte(`{"no-such-setting": 1}`), 0o644)
	if _, err := loadServeConfig([]string{"--config", file}, env(nil)); err == nil || !strings.Contains(err.Error(), "no-such-setting") {
		t.Fatalf("unknown file key: %v", err)
	}
}
