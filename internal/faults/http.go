package faults

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// Path is where Register serves the fault state on the admin listener.
const Path = "/debug/faults"

// errnoOf maps an error name a request may give to the error injected;
// "none" (nil) disarms the fault.
func errnoOf(name string) (err error, ok bool) {
	switch name {
	case "eio":
		return syscall.EIO, true
	case "enospc":
		return syscall.ENOSPC, true
	case "none":
		return nil, true
	}
	return nil, false
}

const errnoNames = `"eio", "enospc" or "none"`

// maxRequestBytes bounds a POST body.
const maxRequestBytes = 64 << 10

// Request is the body of POST /debug/faults. An absent field leaves its
// fault as it is; Clear is applied first, then the others.
type Request struct {
	// ClockOffset sets the clock's offset from the real time: a Go
	// duration ("30s", "-10s", "0s").
	ClockOffset *string `json:"clock_offset"`
	// DiskDelay is waited before every write and fsync: a Go duration,
	// "0s" removes it.
	DiskDelay *string `json:"disk_delay"`
	// FsyncError fails fsyncs: "eio" or "enospc"; "none" stops.
	FsyncError *string `json:"fsync_error"`
	// FsyncCount is how many fsyncs from now fail; 0 (or absent) means
	// every one until cleared. Only with FsyncError.
	FsyncCount *int `json:"fsync_count"`
	// WriteError fails every write: "eio" or "enospc"; "none" stops.
	WriteError *string `json:"write_error"`
	// Clear sets the offset to 0 and disarms every disk fault.
	Clear *bool `json:"clear"`
}

// change is a checked Request, ready to apply.
type change struct {
	clear                bool
	offset, delay        *time.Duration
	syncErr              string
	syncCount            int
	writeErr             string
	hasSyncErr, hasWrite bool
}

// check validates r and reports every problem at once.
func (r *Request) check() (change, error) {
	var c change
	var errs []error
	dur := func(field string, v *string) *time.Duration {
		if v == nil {
			return nil
		}
		d, err := time.ParseDuration(strings.TrimSpace(*v))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a Go duration such as \"30s\" or \"-10s\"", field, *v))
			return nil
		}
		return &d
	}
	if c.offset = dur("clock_offset", r.ClockOffset); c.offset != nil && (*c.offset > MaxClockOffset || *c.offset < -MaxClockOffset) {
		errs = append(errs, fmt.Errorf("clock_offset: %v is beyond ±%v", *c.offset, MaxClockOffset))
	}
	if c.delay = dur("disk_delay", r.DiskDelay); c.delay != nil && (*c.delay < 0 || *c.delay > MaxDiskDelay) {
		errs = append(errs, fmt.Errorf("disk_delay: %v is outside [0s, %v]", *c.delay, MaxDiskDelay))
	}
	errName := func(field string, v *string) string {
		name := strings.ToLower(strings.TrimSpace(*v))
		if _, ok := errnoOf(name); !ok {
			errs = append(errs, fmt.Errorf("%s: %q is not an error this build injects: want %s", field, *v, errnoNames))
		}
		return name
	}
	if r.FsyncError != nil {
		c.hasSyncErr, c.syncErr = true, errName("fsync_error", r.FsyncError)
	}
	if r.FsyncCount != nil {
		switch {
		case r.FsyncError == nil:
			errs = append(errs, errors.New("fsync_count: given without fsync_error"))
		case *r.FsyncCount < 0:
			errs = append(errs, fmt.Errorf("fsync_count: %d is negative (0 means every fsync)", *r.FsyncCount))
		default:
			c.syncCount = *r.FsyncCount
		}
	}
	if r.WriteError != nil {
		c.hasWrite, c.writeErr = true, errName("write_error", r.WriteError)
	}
	c.clear = r.Clear != nil && *r.Clear
	if r.ClockOffset == nil && r.DiskDelay == nil && r.FsyncError == nil && r.WriteError == nil && r.Clear == nil {
		errs = append(errs, errors.New("no fault given: set clock_offset, disk_delay, fsync_error (and fsync_count), write_error or clear"))
	}
	if len(errs) > 0 {
		return change{}, errors.Join(errs...)
	}
	return c, nil
}

// Apply checks r and, if it is valid, applies all of it; an invalid
// request changes nothing.
func (s *State) Apply(r Request) error {
	c, err := r.check()
	if err != nil {
		return err
	}
	if c.clear {
		s.Clear()
	}
	if c.delay != nil {
		if err := s.SetDiskDelay(*c.delay); err != nil {
			return err
		}
	}
	if c.hasSyncErr {
		if err := s.FailSyncs(c.syncErr, c.syncCount); err != nil {
			return err
		}
	}
	if c.hasWrite {
		if err := s.FailWrites(c.writeErr); err != nil {
			return err
		}
	}
	if c.offset != nil {
		return s.SetOffset(*c.offset)
	}
	return nil
}

// DecodeRequest reads one JSON Request from body: unknown fields, a wrong
// type and trailing data are errors that name the problem.
func DecodeRequest(body io.Reader) (Request, error) {
	var r Request
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		var te *json.UnmarshalTypeError
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &te) && te.Field == "":
			return Request{}, fmt.Errorf("bad request body: want a JSON object, got %s", te.Value)
		case errors.As(err, &te):
			return Request{}, fmt.Errorf("%s: want a JSON %s, got %s", te.Field, jsonKind(te.Type.String()), te.Value)
		case errors.As(err, &mbe):
			return Request{}, fmt.Errorf("request body larger than %d bytes", mbe.Limit)
		case errors.Is(err, io.EOF):
			return Request{}, errors.New("empty request body: want a JSON object such as {\"clock_offset\":\"30s\"}")
		}
		return Request{}, fmt.Errorf("bad request body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Request{}, errors.New("bad request body: data after the JSON object")
	}
	return r, nil
}

func jsonKind(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "string":
		return "string"
	case "int":
		return "integer"
	case "bool":
		return "boolean"
	}
	return goType
}

// ServeHTTP serves GET (the Status) and POST (a Request, answered with
// the new Status) as JSON. A bad request is answered 400 with
// {"error": "..."} and changes nothing.
func (s *State) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost:
		req, err := DecodeRequest(http.MaxBytesReader(w, r.Body, maxRequestBytes))
		if err == nil {
			err = s.Apply(req)
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": strings.ReplaceAll(err.Error(), "\n", "; ")})
			return
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": r.Method + " is not allowed: GET reads the faults, POST sets them"})
		return
	}
	writeJSON(w, http.StatusOK, s.Status())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
