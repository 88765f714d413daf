package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// A client listener reachable beyond loopback requires logins unless told
// otherwise; told off (or optional) it is announced with a SECURITY
// warning at start. One on loopback defaults to off, without a warning.
func TestWarnsWhenTheListenerIsExposed(t *testing.T) {
	for _, c := range []struct {
		listen, auth string
		mode         string
		warn         bool
	}{
		{"127.0.0.1:0", "", "off", false},
		{"0.0.0.0:0", "", "required", false},
		{"0.0.0.0:0", "off", "off", true},
		{"0.0.0.0:0", "optional", "optional", true},
	} {
		cfg := Default()
		cfg.DataDir, cfg.Listen, cfg.Admin, cfg.Auth = t.TempDir(), c.listen, "", c.auth
		var log syncBuffer
		b, err := Start(cfg, slog.New(slog.NewTextHandler(&log, nil)))
		if err != nil {
			t.Fatal(err)
		}
		mode := b.auth.Mode().String()
		b.Shutdown()
		log.mu.Lock()
		got := strings.Contains(log.b.String(), "SECURITY: a client listener is reachable beyond this host and does not require a login")
		log.mu.Unlock()
		if got != c.warn || mode != c.mode {
			t.Errorf("--listen %s --auth %q: mode %s, warned %v; want %s, %v", c.listen, c.auth, mode, got, c.mode, c.warn)
		}
	}
}
