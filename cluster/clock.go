package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"
)

// ClusterNow estimates the cluster's time: every peer this node knows is
// asked for its wall clock (/herald/time on its health endpoint), each
// answer taken as a lower bound (the peer read its clock before this node
// read its own at receipt, so the offset is never overstated, by at most
// the round trip), and the result is this node's
// clock moved by the lower median of the offsets, its own (0) among them.
// With three nodes one clock stepped either way is outvoted; with two
// the earlier clock wins (a scheduler anchored to it is late, never
// early). Peers that do not answer within ctx are left out; peers is how
// many answered (0: this node's clock as it is).
func (n *Node) ClusterNow(ctx context.Context) (now time.Time, offset time.Duration, peers int) {
	var (
		mu      sync.Mutex
		offsets = []time.Duration{0}
		wg      sync.WaitGroup
	)
	for _, h := range n.peerHealth() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if off, ok := n.peerOffset(ctx, h); ok {
				mu.Lock()
				offsets = append(offsets, off)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(offsets)
	offset = offsets[(len(offsets)-1)/2]
	return n.cfg.Now().Add(offset), offset, len(offsets) - 1
}

// peerOffset is how far the peer at health address h is ahead of this
// node's clock, as a lower bound: the peer's reading is compared with
// this node's clock at receipt, so a slow round trip makes the estimate
// late, never early (a scheduler anchored to it never fires early).
func (n *Node) peerOffset(ctx context.Context, h string) (time.Duration, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.scheme()+h+"/herald/time", nil)
	if err != nil {
		return 0, false
	}
	resp, err := n.client.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var ans struct {
		UnixNano int64 `json:"unix_nano"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&ans) != nil || ans.UnixNano == 0 {
		return 0, false
	}
	return time.Unix(0, ans.UnixNano).Sub(n.cfg.Now().Round(0)), true
}
