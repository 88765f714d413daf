package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/dlq"
	"github.com/heraldmq/herald/filter"
	heraldpb "github.com/heraldmq/herald/proto"
)

// RedriveRequest is the body of POST /api/v1/groups/{name}/dlq/redrive.
type RedriveRequest struct {
	// DryRun reports what would be redriven and sends nothing.
	DryRun bool `json:"dry_run"`
	// Filter, an SQL filter over the dead letters' headers and tags,
	// picks which ones go back ("" = all).
	Filter string `json:"filter,omitempty"`
	// Max bounds the dead letters read in one call (default and at most
	// maxRedriveRead); Next says where to go on.
	Max int `json:"max,omitempty"`
	// From: the offset of each partition to start at (default the log
	// start), as a call's Next gives it.
	From map[int32]int64 `json:"from,omitempty"`
}

// RedriveResult is the answer of a redrive.
type RedriveResult struct {
	Topic    string `json:"topic"`
	Read     int    `json:"read"`
	Matched  int    `json:"matched"`
	Redriven int    `json:"redriven"` // or would be, in a dry run
	Skipped  int    `json:"skipped"`  // not dead letters
	Failed   int    `json:"failed"`
	// Failures: the first ones, "topic/partition@offset: why".
	Failures []string `json:"failures"`
	// Next is the From of a call that goes on after this one; Done
	// whether it read up to the high watermarks seen when it started.
	Next   map[int32]int64 `json:"next"`
	Done   bool            `json:"done"`
	DryRun bool            `json:"dry_run"`
}

const (
	maxRedriveRead     = 10_000
	maxRedriveFailures = 20
	redriveBudget      = 25 * time.Second
)

// redriveDLQ is POST /api/v1/groups/{name}/dlq/redrive: the group's
// dead letters back to their origin topics, as `herald dlq redrive` sends
// them (package dlq). The dead-letter topic is not changed.
func (s *Server) redriveDLQ(ctx context.Context, c *client.Client, r *http.Request) (any, error) {
	var req RedriveRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if req.Max <= 0 || req.Max > maxRedriveRead {
		req.Max = maxRedriveRead
	}
	var f *filter.Filter
	if strings.TrimSpace(req.Filter) != "" {
		var err error
		if f, err = filter.ParseSQL(req.Filter); err != nil {
			return nil, apiError(heraldpb.ErrorCode_INVALID_REQUEST, "filter: %v", err)
		}
	}
	gi, err := c.DescribeGroup(ctx, r.PathValue("name"))
	if err != nil {
		return nil, err
	}
	topic := gi.GetDeadLetterTopic()
	ti, err := c.DescribeTopic(ctx, topic)
	if client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		return nil, apiError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "group %s has no dead letters yet: %s is created with the first", gi.GetGroup(), topic)
	} else if err != nil {
		return nil, err
	}
	res := &RedriveResult{Topic: topic, Failures: []string{}, Next: map[int32]int64{}, Done: true, DryRun: req.DryRun}
	var mu sync.Mutex
	rd := dlq.NewRedriver(c, req.DryRun)
	rctx, cancel := context.WithTimeout(ctx, redriveBudget)
	defer cancel()
	for _, pi := range ti.GetPartitions() {
		p := int32(pi.GetId())
		o, err := c.ListOffsets(rctx, topic, p, client.OffsetLatest, time.Time{})
		if err != nil {
			rd.Close()
			return nil, err
		}
		lo := max(o.LogStart, req.From[p])
		res.Next[p] = lo
		if lo >= o.HighWatermark {
			continue
		}
		mu.Lock()
		left := req.Max - res.Read
		mu.Unlock()
		if left <= 0 {
			res.Done = false
			continue
		}
		next, err := dlq.Read(rctx, c, topic, p, lo, o.HighWatermark, func(m *client.Message) bool {
			rec := dlq.Record(m)
			mu.Lock()
			res.Read++
			stop := res.Read >= req.Max
			if !f.Match(filter.FromProto(rec)) {
				mu.Unlock()
				return stop
			}
			res.Matched++
			mu.Unlock()
			at := fmt.Sprintf("%s/%d@%d", topic, m.Partition, m.Offset)
			rd.Send(rctx, m, rec, func(out dlq.Outcome) {
				mu.Lock()
				defer mu.Unlock()
				switch out.Kind {
				case dlq.Skipped:
					res.Skipped++
				case dlq.Failed:
					res.Failed++
					if len(res.Failures) < maxRedriveFailures {
						res.Failures = append(res.Failures, fmt.Sprintf("%s: %v", at, out.Err))
					}
				default:
					res.Redriven++
				}
			})
			return stop
		})
		res.Next[p] = next
		if next < o.HighWatermark {
			res.Done = false
		}
		if err != nil && rctx.Err() == nil {
			rd.Close()
			return nil, err
		}
	}
	rd.Close() // every outcome counted
	return res, nil
}
