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

// A plaintext client listener reachable beyond loopback is announced with
// a SECURITY warning at start; one on loopback is not.
func TestWarnsWhenTheListenerIsExposed(t *testing.T) {
	for _, c := range []struct {
		listen string
		warn   bool
	}{{"127.0.0.1:0", false}, {"0.0.0.0:0", true}} {
		cfg := Default()
		cfg.DataDir, cfg.Listen, cfg.Admin = t.TempDir(), c.listen, ""
		var log syncBuffer
		b, err := Start(cfg, slog.New(slog.NewTextHandler(&log, nil)))
		if err != nil {
			t.Fatal(err)
		}
		b.Shutdown()
		log.mu.Lock()
		got := strings.Contains(log.b.String(), "SECURITY: the plaintext client listener is reachable beyond this host")
		log.mu.Unlock()
		if got != c.warn {
			t.Errorf("--listen %s: warned %v, want %v", c.listen, got, c.warn)
		}
	}
}
