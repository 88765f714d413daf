package faults

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/heraldmq/herald/persistence/vfs"
)

func do(t *testing.T, s *State, method, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(method, Path, strings.NewReader(body)))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: content type %q", method, body, ct)
	}
	return rec.Code, rec.Body.String()
}

func status(t *testing.T, body string) Status {
	t.Helper()
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status %q: %v", body, err)
	}
	return st
}

func TestHTTPSetsFaults(t *testing.T) {
	s := New(vfs.Default)
	for _, tc := range []struct {
		body  string
		check func(Status) bool
	}{
		{`{"clock_offset":"30s"}`, func(st Status) bool { return st.ClockOffset == "30s" }},
		{`{"clock_offset":"-10s"}`, func(st Status) bool { return st.ClockOffset == "-10s" }},
		{`{"disk_delay":"50ms"}`, func(st Status) bool { return st.DiskDelay == "50ms" && st.ClockOffset == "-10s" }},
		{`{"fsync_error":"eio","fsync_count":0}`, func(st Status) bool { return st.FsyncError == "eio" && st.FsyncCount == 0 }},
		{`{"fsync_error":"EIO","fsync_count":3}`, func(st Status) bool { return st.FsyncError == "eio" && st.FsyncCount == 3 }},
		{`{"fsync_error":"none"}`, func(st Status) bool { return st.FsyncError == "" }},
		{`{"write_error":"eio"}`, func(st Status) bool { return st.WriteError == "eio" }},
		{`{"clear":true}`, func(st Status) bool {
			return st == Status{ClockOffset: "0s", Now: st.Now, DiskDelay: "0s"}
		}},
		{`{"clear":true,"clock_offset":"1h"}`, func(st Status) bool { return st.ClockOffset == "1h0m0s" }},
	} {
		code, body := do(t, s, http.MethodPost, tc.body)
		if code != http.StatusOK || !tc.check(status(t, body)) {
			t.Fatalf("POST %s: %d %s", tc.body, code, body)
		}
		if code, got := do(t, s, http.MethodGet, ""); code != http.StatusOK || !tc.check(status(t, got)) {
			t.Fatalf("GET after %s: %d %s", tc.body, code, got)
		}
	}
}

// Bad requests are 400 with a message naming the problem, and change
// nothing, not even their valid parts.
func TestHTTPRefusesBadRequests(t *testing.T) {
	s := New(vfs.Default)
	for _, tc := range []struct{ body, want string }{
		{``, "empty request body"},
		{`{}`, "no fault given"},
		{`{"clock_ofset":"30s"}`, `unknown field "clock_ofset"`},
		{`{"clock_offset":"30"}`, `clock_offset: "30" is not a Go duration`},
		{`{"clock_offset":30}`, "clock_offset: want a JSON string, got number"},
		{`{"clock_offset":"87841h"}`, "clock_offset: 87841h0m0s is beyond ±87840h0m0s"},
		{`{"clock_offset":"-87841h"}`, "clock_offset: -87841h0m0s is beyond"},
		{`{"disk_delay":"-1ms"}`, "disk_delay: -1ms is outside"},
		{`{"disk_delay":"2m"}`, "disk_delay: 2m0s is outside"},
		{`{"fsync_error":"eperm"}`, `fsync_error: "eperm" is not an error this build injects`},
		{`{"fsync_count":2}`, "fsync_count: given without fsync_error"},
		{`{"fsync_error":"eio","fsync_count":-1}`, "fsync_count: -1 is negative"},
		{`{"fsync_error":"eio","fsync_count":"2"}`, "fsync_count: want a JSON integer, got string"},
		{`{"write_error":true}`, "write_error: want a JSON string, got bool"},
		{`{"clear":"yes"}`, "clear: want a JSON boolean, got string"},
		{`{"clock_offset":"30s"} {"clear":true}`, "data after the JSON object"},
		{`{"clock_offset":"30s","disk_delay":"soon"}`, `disk_delay: "soon"`},
		{`{"clock_offset":"x","write_error":"ebusy"}`, `clock_offset: "x" is not a Go duration such as "30s" or "-10s"; write_error: "ebusy"`},
		{`[1]`, "want a JSON object"},
		{`null`, "no fault given"},
		{`{"clock_offset":"` + strings.Repeat("1", 70<<10) + `s"}`, "larger than 65536 bytes"},
	} {
		code, body := do(t, s, http.MethodPost, tc.body)
		var e struct{ Error string }
		json.Unmarshal([]byte(body), &e)
		if code != http.StatusBadRequest || !strings.Contains(e.Error, tc.want) {
			t.Errorf("POST %.80s: %d %s, want 400 with %q", tc.body, code, body, tc.want)
		}
	}
	if st := s.Status(); st != (Status{ClockOffset: "0s", Now: st.Now, DiskDelay: "0s"}) {
		t.Fatalf("bad requests changed the state: %+v", st)
	}
	code, body := do(t, s, http.MethodPut, `{"clear":true}`)
	if code != http.StatusMethodNotAllowed || !strings.Contains(body, "PUT is not allowed") {
		t.Fatalf("PUT: %d %s", code, body)
	}
}

// FuzzDecodeRequest guarantees that no request body panics the decoder,
// and that a body it accepts is checked and applied (or refused) without
// panicking.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"clock_offset":"30s"}`, `{"fsync_error":"eio","fsync_count":0}`, `{"clear":true}`, `{"disk_delay":"1ms"}`, `{`, `null`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r, err := DecodeRequest(strings.NewReader(body))
		if err != nil {
			return
		}
		s := New(vfs.Default)
		_ = s.Apply(r)
	})
}
