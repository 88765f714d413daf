package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"time"

	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/labstack/echo"
)

// peersProvider is the default membership provider: automanaged's model
// (each node serves /_health and polls its peers'), with two changes.
// protoactor's automanaged provider drops a peer from the topology on a
// single failed poll (a 2 s timeout), and the rest of the cluster then
// blocks that member id for good: a node stalled for two seconds (a GC
// pause on a loaded machine, a storm of elections) is thrown out and must
// rejoin, and every one of its raft groups is disturbed. Here a peer
// that does not answer in time stays a member for up to `tolerate`
// consecutive failed polls; one that refuses the connection (its process
// is gone) is dropped at once. It also keeps no package-level state, so
// several nodes can share a process (tests).
type peersProvider struct {
	hosts    func() []string // health endpoints, this node's included
	refresh  time.Duration
	tolerate int
	server   *echo.Echo // serves this node's /_health (listener set)
	client   *http.Client
	scheme   string // "http://" or, with mutual TLS, "https://"
	log      *slog.Logger

	cluster *pcluster.Cluster
	peers   map[string]*peerState
	stop    chan struct{}
	once    sync.Once
	done    sync.WaitGroup
}

// peerState is what the provider knows of one health endpoint.
type peerState struct {
	last     *automanaged.NodeModel // the last answer, nil before the first
	failures int                    // consecutive failed polls since
}

func newPeersProvider(hosts func() []string, refresh time.Duration, tolerate int, server *echo.Echo, log *slog.Logger) *peersProvider {
	return &peersProvider{hosts: hosts, refresh: refresh, tolerate: max(1, tolerate), server: server,
		client: &http.Client{Timeout: 2 * time.Second}, scheme: "http://", log: log, peers: map[string]*peerState{}, stop: make(chan struct{})}
}

func (p *peersProvider) StartMember(cl *pcluster.Cluster) error {
	p.cluster = cl
	p.done.Add(2)
	go func() {
		defer p.done.Done()
		if err := p.server.Start(""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("membership health endpoint stopped", "err", err)
		}
	}()
	go p.monitor()
	return nil
}

func (p *peersProvider) StartClient(cl *pcluster.Cluster) error { return p.StartMember(cl) }

func (p *peersProvider) Shutdown(bool) error {
	p.once.Do(func() {
		close(p.stop)
		_ = p.server.Close()
	})
	p.done.Wait()
	return nil
}

// monitor polls every health endpoint each refresh and publishes the
// members it keeps.
func (p *peersProvider) monitor() {
	defer p.done.Done()
	for {
		p.poll()
		select {
		case <-p.stop:
			return
		case <-time.After(p.refresh):
		}
	}
}

type pollResult struct {
	host string
	node *automanaged.NodeModel
	err  error
}

func (p *peersProvider) poll() {
	hosts := p.hosts()
	results := make(chan pollResult, len(hosts))
	for _, h := range hosts {
		go func() {
			n, err := p.check(h)
			results <- pollResult{host: h, node: n, err: err}
		}()
	}
	for range hosts {
		r := <-results
		st := p.peers[r.host]
		if st == nil {
			st = &peerState{}
			p.peers[r.host] = st
		}
		st.observe(r.node, r.err, p.tolerate)
	}
	var members []*pcluster.Member
	for _, h := range hosts {
		if n := p.peers[h].member(p.tolerate); n != nil && n.ClusterName == p.cluster.Config.Name {
			members = append(members, &pcluster.Member{Id: n.ID, Host: n.Address, Port: int32(n.Port), Kinds: n.Kinds})
		}
	}
	select {
	case <-p.stop:
		return // do not publish a topology while the member shuts down
	default:
	}
	p.cluster.MemberList.UpdateClusterTopology(members)
}

// observe records one poll: an answer, or a failure; a refused
// connection counts as all the failures tolerated at once.
func (st *peerState) observe(n *automanaged.NodeModel, err error, tolerate int) {
	switch {
	case err == nil:
		st.last, st.failures = n, 0
	case errors.Is(err, syscall.ECONNREFUSED):
		st.failures = tolerate
	default:
		st.failures++
	}
}

// member is the peer as a member of the topology, or nil when it is not one.
func (st *peerState) member(tolerate int) *automanaged.NodeModel {
	if st == nil || st.last == nil || st.failures >= tolerate {
		return nil
	}
	return st.last
}

func (p *peersProvider) check(host string) (*automanaged.NodeModel, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.client.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.scheme+host+"/_health", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("health of %s: status %d", host, resp.StatusCode)
	}
	var n automanaged.NodeModel
	if err := json.NewDecoder(resp.Body).Decode(&n); err != nil {
		return nil, fmt.Errorf("health of %s: %w", host, err)
	}
	return &n, nil
}
