//go:build !chaos

package broker

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// A normal build has no fault endpoint: /debug/faults is not found, for
// reads and for writes (the chaos build's is tested in
// faults_chaos_test.go).
func TestNoFaultEndpoint(t *testing.T) {
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	b, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	url := "http://" + b.AdminAddr() + "/debug/faults"
	for _, req := range []func() (*http.Response, error){
		func() (*http.Response, error) { return http.Get(url) },
		func() (*http.Response, error) {
			return http.Post(url, "application/json", strings.NewReader(`{"clock_offset":"30s"}`))
		},
	} {
		resp, err := req()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s %s: %d, want 404", resp.Request.Method, url, resp.StatusCode)
		}
	}
	// The admin listener itself is up.
	resp, err := http.Get("http://" + b.AdminAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
}
