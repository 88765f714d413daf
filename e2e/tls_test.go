package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/tlsconf"
	heraldpb "github.com/heraldmq/herald/proto"
)

// tlsLab is a CA and a broker serving TLS with a certificate it signed.
type tlsLab struct {
	dir  string
	ca   *tlsconf.CA
	p    *proc
	addr string // the TLS listener
}

var tlsLine = regexp.MustCompile(`msg="herald serving".* clients_tls=(\S+)`)

// startTLSLab writes a CA, a server certificate for 127.0.0.1 and a client
// certificate "alice", and starts a broker whose TLS listener requires
// client certificates from that CA.
func startTLSLab(t *testing.T, extra ...string) *tlsLab {
	t.Helper()
	dir := t.TempDir()
	ca, err := tlsconf.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	l := &tlsLab{dir: dir, ca: ca}
	l.issue(t, "server", tlsconf.LeafSpec{Name: "herald", Hosts: []string{"127.0.0.1"}})
	l.issue(t, "alice", tlsconf.LeafSpec{Name: "alice", Client: true})
	l.p = startProc(t, t.TempDir(), append([]string{"--listen-tls", "127.0.0.1:0",
		"--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server-key.pem"),
		"--tls-client-ca", filepath.Join(dir, "ca.pem")}, extra...)...)
	m := tlsLine.FindStringSubmatch(l.p.logs())
	if m == nil {
		t.Fatalf("no TLS address in the log:\n%s", l.p.logs())
	}
	l.addr = m[1]
	return l
}

// issue writes name.pem and name-key.pem signed by the lab's CA, valid
// for an hour from a minute ago unless spec says otherwise.
func (l *tlsLab) issue(t *testing.T, name string, spec tlsconf.LeafSpec) tlsconf.Leaf {
	t.Helper()
	if spec.NotBefore.IsZero() {
		spec.NotBefore, spec.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	}
	leaf, err := l.ca.Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.Write(l.dir, name); err != nil {
		t.Fatal(err)
	}
	return leaf
}

func (l *tlsLab) file(name string) string { return filepath.Join(l.dir, name) }

// clientTLS is the client configuration trusting caFile with the client
// certificate name ("" = none).
func (l *tlsLab) clientTLS(t *testing.T, caFile, name string) *tls.Config {
	t.Helper()
	files := tlsconf.ClientFiles{CA: caFile}
	if name != "" {
		files.Cert, files.Key = l.file(name+".pem"), l.file(name+"-key.pem")
	}
	cfg, err := tlsconf.Client(files)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (l *tlsLab) dial(t *testing.T, cfg *tls.Config) (*client.Client, error) {
	t.Helper()
	c, err := client.Dial(ctxT(t, 10*time.Second), l.addr, client.WithTLS(cfg))
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// Everything works over the TLS listener: produce, fetch, and a push
// subscription (the broker's pushes go through the relay too), with the
// principal of the client certificate known to the broker.
func TestTLSProduceFetchSubscribe(t *testing.T) {
	l := startTLSLab(t)
	c, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "alice"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if _, err := c.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	p := c.NewProducer()
	defer p.Close(context.Background())
	const n = 200
	for i := range n {
		if _, err := p.Send(ctx, &client.Message{Topic: "orders", Value: []byte(fmt.Sprintf("m%d", i))}); err != nil {
			t.Fatalf("produce %d over TLS: %v", i, err)
		}
	}
	res, err := c.Fetch(ctx, "orders", 0, 0, 1<<20, 0)
	if err != nil || len(res.Messages) != n || string(res.Messages[n-1].Value) != fmt.Sprintf("m%d", n-1) {
		t.Fatalf("fetch over TLS: %d messages, err %v", len(res.Messages), err)
	}
	var got atomic.Int64
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "g", Topic: "orders", From: client.Earliest()},
		func(_ context.Context, m *client.Delivered) {
			got.Add(1)
			m.Ack()
		})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	checkFor(t, 20*time.Second, "every message pushed over TLS", func() error {
		if g := got.Load(); g < n {
			return fmt.Errorf("%d pushed", g)
		}
		return nil
	})
	if err := sub.Flush(ctx); err != nil {
		t.Fatalf("acks over TLS: %v", err)
	}
}

// Each way of getting TLS wrong gives a clear error at once, and the
// broker stays up and serves a good client afterwards.
func TestTLSRefusals(t *testing.T) {
	l := startTLSLab(t)
	other, err := tlsconf.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(l.file("other-ca.pem"), other.CertPEM(), 0o644)
	stranger, err := other.Issue(tlsconf.LeafSpec{Name: "mallory", Client: true, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	stranger.Write(l.dir, "mallory")
	l.issue(t, "expired", tlsconf.LeafSpec{Name: "expired", Client: true, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})

	cases := []struct {
		name string
		dial func() error
		want string // in the error
		tls  bool   // the error is ErrTLS
	}{
		{"no client certificate", func() error { _, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "")); return err }, "certificate required", true},
		{"client certificate of another CA", func() error {
			_, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "mallory"))
			return err
		}, "refused the connection: remote error: tls: certificate required", true},
		{"expired client certificate", func() error {
			_, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "expired"))
			return err
		}, "expired", true},
		{"broker certificate of an unknown CA", func() error {
			_, err := l.dial(t, l.clientTLS(t, l.file("other-ca.pem"), "alice"))
			return err
		}, "unknown authority", true},
		{"plaintext to the TLS port", func() error {
			_, err := client.Dial(ctxT(t, 10*time.Second), l.addr)
			return err
		}, "this port is the TLS listener", false},
		{"TLS to the plaintext port", func() error {
			_, err := client.Dial(ctxT(t, 10*time.Second), l.p.Addr(), client.WithTLS(l.clientTLS(t, l.file("ca.pem"), "alice")))
			return err
		}, "did not answer with TLS", true},
	}
	for _, tc := range cases {
		start := time.Now()
		err := tc.dial()
		if err == nil {
			t.Fatalf("%s: connected", tc.name)
		}
		if !strings.Contains(err.Error(), tc.want) || errors.Is(err, client.ErrTLS) != tc.tls {
			t.Errorf("%s: error %q, want one containing %q (ErrTLS: %v)", tc.name, err, tc.want, tc.tls)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("%s: the error took %v", tc.name, took)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	c, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "alice"))
	if err != nil {
		t.Fatalf("a good client after the refusals: %v", err)
	}
	if _, err := c.CreateTopic(ctxT(t, 10*time.Second), "after", nil); err != nil {
		t.Fatal(err)
	}
}

// servedSerial is the serial number of the certificate the TLS listener
// shows a new connection.
func servedSerial(t *testing.T, l *tlsLab) (*big.Int, error) {
	cfg := l.clientTLS(t, l.file("ca.pem"), "alice")
	cfg.ServerName = "127.0.0.1"
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	nc, err := d.DialContext(context.Background(), "tcp", l.addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	return nc.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// The server certificate is rotated twice under load, once with SIGHUP
// and once by the file changing alone: new connections get the new
// certificate, and no request of a producer writing throughout fails.
func TestTLSCertificateRotationUnderLoad(t *testing.T) {
	l := startTLSLab(t)
	c, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "alice"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTopic(ctxT(t, 10*time.Second), "load", nil); err != nil {
		t.Fatal(err)
	}
	var sent, failed atomic.Int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p := c.NewProducer()
		defer p.Close(context.Background())
		for {
			select {
			case <-stop:
				return
			default:
			}
			// New connections too: each round dials once.
			if _, err := p.Send(context.Background(), &client.Message{Topic: "load", Value: []byte("x")}); err != nil {
				failed.Add(1)
				lastErr.Store(err.Error())
			}
			sent.Add(1)
		}
	}()
	rotate := func(how string) {
		before, err := servedSerial(t, l)
		if err != nil {
			t.Fatal(err)
		}
		// Written to new files renamed over the old ones, as cert-manager
		// and certbot do: a reader never sees half a file.
		leaf, err := l.ca.Issue(tlsconf.LeafSpec{Name: "herald", Hosts: []string{"127.0.0.1"}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		leaf.Write(l.dir, "next")
		os.Rename(l.file("next-key.pem"), l.file("server-key.pem"))
		os.Rename(l.file("next.pem"), l.file("server.pem"))
		if how == "SIGHUP" {
			l.p.cmd.Process.Signal(syscall.SIGHUP)
		}
		checkFor(t, 15*time.Second, "new connections get the new certificate ("+how+")", func() error {
			now, err := servedSerial(t, l)
			if err != nil {
				return err
			}
			if now.Cmp(before) == 0 {
				return errors.New("still the old certificate")
			}
			return nil
		})
		// A client dialled now works with the new certificate.
		if c2, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "alice")); err != nil {
			t.Fatalf("dial after the %s rotation: %v", how, err)
		} else if _, err := c2.Fetch(ctxT(t, 10*time.Second), "load", 0, 0, 1024, 0); err != nil {
			t.Fatalf("fetch after the %s rotation: %v", how, err)
		}
	}
	checkFor(t, 10*time.Second, "load running", func() error {
		if sent.Load() < 100 {
			return fmt.Errorf("%d sent", sent.Load())
		}
		return nil
	})
	rotate("SIGHUP")
	rotate("file change")
	n := sent.Load()
	checkFor(t, 10*time.Second, "load after the rotations", func() error {
		if sent.Load() < n+100 {
			return fmt.Errorf("%d sent since", sent.Load()-n)
		}
		return nil
	})
	close(stop)
	<-done
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d produces failed during the rotations; last: %v", f, sent.Load(), lastErr.Load())
	}
	if !strings.Contains(l.p.logs(), `TLS certificates reloaded" why=SIGHUP`) || !strings.Contains(l.p.logs(), `why="files changed"`) {
		t.Errorf("the reloads were not logged:\n%s", l.p.logs())
	}
	t.Logf("%d produces over TLS, none failed, across two rotations", sent.Load())
}

// herald dev-certs writes certificates a broker serves with and the CLI
// connects with, and refuses to overwrite them.
func TestDevCertsCLI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	out, stderr, code := herald(t, "", "dev-certs", dir)
	if code != 0 {
		t.Fatalf("dev-certs: %d %s", code, stderr)
	}
	for _, f := range tlsconf.DevCertFiles(3) {
		if !strings.Contains(out, filepath.Join(dir, f)) {
			t.Fatalf("dev-certs output does not list %s:\n%s", f, out)
		}
	}
	p := startProc(t, t.TempDir(), "--listen-tls", "127.0.0.1:0", "--tls-cert", filepath.Join(dir, "server.pem"),
		"--tls-key", filepath.Join(dir, "server-key.pem"), "--tls-client-ca", filepath.Join(dir, "ca.pem"))
	addr := tlsLine.FindStringSubmatch(p.logs())[1]
	tlsFlags := []string{"--addr", addr, "--tls-ca", filepath.Join(dir, "ca.pem"),
		"--tls-cert", filepath.Join(dir, "client.pem"), "--tls-key", filepath.Join(dir, "client-key.pem")}
	if _, stderr, code := herald(t, "", append([]string{"topic", "create", "t"}, tlsFlags...)...); code != 0 {
		t.Fatalf("topic create over TLS: %d %s", code, stderr)
	}
	if _, stderr, code := herald(t, "", append([]string{"produce", "--topic", "t", "--count", "3"}, tlsFlags...)...); code != 0 {
		t.Fatalf("produce over TLS: %d %s", code, stderr)
	}
	out, stderr, code = herald(t, "", append([]string{"topic", "list"}, tlsFlags[:4]...)...)
	if code == 0 || !strings.Contains(stderr, "certificate required") {
		t.Fatalf("topic list without a client certificate: %d %q %q", code, out, stderr)
	}
	if _, stderr, code := herald(t, "", "dev-certs", dir); code == 0 || !strings.Contains(stderr, "not overwriting") {
		t.Fatalf("dev-certs over existing files: %d %s", code, stderr)
	}
}

// In a cluster, metadata gives TLS clients each node's TLS address: a
// client that bootstraps from one node's TLS listener produces to a
// partition another node leads, over TLS.
func TestTLSCluster(t *testing.T) {
	dir := t.TempDir()
	if _, stderr, code := herald(t, "", "dev-certs", dir); code != 0 {
		t.Fatalf("dev-certs: %s", stderr)
	}
	tc, plain := clusterWithTopic(t, "orders", 1, "--listen-tls", "127.0.0.1:0", "--tls-cert", filepath.Join(dir, "server.pem"),
		"--tls-key", filepath.Join(dir, "server-key.pem"))
	tlsAddr := map[uint64]string{}
	for id, p := range tc.nodes {
		tlsAddr[id] = tlsLine.FindStringSubmatch(p.logs())[1]
	}
	var leader uint64
	checkFor(t, 15*time.Second, "partition 0 has a leader", func() error {
		info, err := plain.DescribeTopic(ctxT(t, 5*time.Second), "orders")
		if err != nil {
			return err
		}
		if leader = uint64(info.Partitions[0].Leader); tc.nodes[leader] == nil {
			return fmt.Errorf("leader %d", leader)
		}
		return nil
	})
	boot := leader%3 + 1 // another node
	cfg, err := tlsconf.Client(tlsconf.ClientFiles{CA: filepath.Join(dir, "ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(ctxT(t, 10*time.Second), tlsAddr[boot], client.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.NewProducer(client.WithManualPartitions())
	defer p.Close(context.Background())
	for i := range 20 {
		r, err := p.Send(ctxT(t, 15*time.Second), &client.Message{Topic: "orders", Partition: 0, Value: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatalf("produce over TLS through node %d to node %d's partition: %v", boot, leader, err)
		}
		if r.Offset != int64(i) {
			t.Fatalf("offset %d, want %d", r.Offset, i)
		}
	}
	md, err := c.Metadata(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range md.GetBrokers() {
		if b.GetTlsAddr() != tlsAddr[uint64(b.GetNodeId())] {
			t.Errorf("metadata gives node %d the TLS address %q, want %q", b.GetNodeId(), b.GetTlsAddr(), tlsAddr[uint64(b.GetNodeId())])
		}
	}
}

// clusterCerts writes a cluster CA with node certificates for 127.0.0.1
// (node-N.pem) and, for the intruder, a node certificate of another CA.
func clusterCerts(t *testing.T, nodes int) string {
	t.Helper()
	dir := t.TempDir()
	for _, ca := range []struct{ name, file string }{{"cluster CA", "ca"}, {"rogue CA", "rogue-ca"}} {
		c, err := tlsconf.NewCA(ca.name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, ca.file+".pem"), c.CertPEM(), 0o644)
		names := map[string]uint64{"rogue-node": 4}
		if ca.file == "ca" {
			names = map[string]uint64{}
			for i := 1; i <= nodes; i++ {
				names[fmt.Sprintf("node-%d", i)] = uint64(i)
			}
		}
		for n, id := range names {
			leaf, err := c.Issue(tlsconf.LeafSpec{Name: n, Node: true, NodeID: id, Hosts: []string{"127.0.0.1"}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			leaf.Write(dir, n)
		}
	}
	return dir
}

// A cluster whose nodes talk mutual TLS, each with a certificate naming
// its node id, works (an RF=3 topic takes writes), and a process that
// names the cluster as its peers but holds no certificate of the cluster
// CA, or one of another CA, is refused with a logged reason and never
// registered; so is one holding a valid certificate of another node id.
func TestClusterMutualTLS(t *testing.T) {
	dir := clusterCerts(t, 3)
	tc, c := clusterWithTopic(t, "orders", 3, "--cluster-tls-cert", filepath.Join(dir, "node-{id}.pem"), "--cluster-tls-key", filepath.Join(dir, "node-{id}-key.pem"),
		"--cluster-tls-ca", filepath.Join(dir, "ca.pem"))
	p := c.NewProducer()
	defer p.Close(context.Background())
	for i := range 30 {
		if _, err := p.Send(ctxT(t, 15*time.Second), &client.Message{Topic: "orders", Key: []byte(fmt.Sprint(i)), Value: []byte("v")}); err != nil {
			t.Fatalf("produce on the mutual-TLS cluster: %v", err)
		}
	}
	refuseIntruders(t, tc, "TLS handshake failed", []intruder{
		{"no certificate", nil},
		{"another CA's certificate", []string{"--cluster-tls-cert", filepath.Join(dir, "rogue-node.pem"), "--cluster-tls-key", filepath.Join(dir, "rogue-node-key.pem"),
			"--cluster-tls-ca", filepath.Join(dir, "rogue-ca.pem")}},
	})
	refuseIntruders(t, tc, `the node did not prove its id`, []intruder{
		{"node 1's certificate, claiming node 4", []string{"--cluster-tls-cert", filepath.Join(dir, "node-1.pem"), "--cluster-tls-key", filepath.Join(dir, "node-1-key.pem"),
			"--cluster-tls-ca", filepath.Join(dir, "ca.pem")}},
	})
}

// intruder is a process that names a cluster as its peers, with args.
type intruder struct {
	name string
	args []string
}

// refuseIntruders starts each intruder as node 4 of tc and checks that the
// nodes log a refusal (a line containing logged) and never register it.
func refuseIntruders(t *testing.T, tc *testCluster, logged string, intruders []intruder) {
	t.Helper()
	for _, intruder := range intruders {
		refusals := func() int {
			n := 0
			for _, q := range tc.nodes {
				n += strings.Count(q.logs(), logged)
			}
			return n
		}
		before := refusals()
		cl, health := pairPorts(t)
		peers := append(slices.Clone(tc.peers), "4@"+cl)
		cmd := exec.Command(heraldBin, append([]string{"serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin", "",
			"--node-id", "4", "--cluster", cl, "--cluster-health", health, "--peers", strings.Join(peers, ",")}, intruder.args...)...)
		out := lockedWriter{new(sync.Mutex), new(strings.Builder)}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 20*time.Second, intruder.name+": the nodes log the refusal", func() error {
			if refusals() <= before {
				return fmt.Errorf("no refusal logged; the intruder's log:\n%s", lastLines(out.String(), 15))
			}
			return nil
		})
		// Given the time a registration takes when it works (about a
		// second), it never appears.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			cv, _, err := getController(tc.nodes[1])
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range cv.Nodes {
				if n.NodeID == 4 {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatalf("%s: the intruder was registered: %+v\n%s", intruder.name, n, out.String())
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// The profiler is refused unless the broker runs with --admin-pprof.
func TestAdminPprofOffByDefault(t *testing.T) {
	get := func(p *proc) (int, string) {
		resp, err := http.Get("http://" + p.AdminAddr() + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(startProc(t, t.TempDir())); code != http.StatusForbidden || !strings.Contains(body, "--admin-pprof") {
		t.Fatalf("pprof by default: %d %q", code, body)
	}
	if code, body := get(startProc(t, t.TempDir(), "--admin-pprof")); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("pprof with --admin-pprof: %d", code)
	}
}

// metricValue reads one unlabelled metric from a node's /metrics.
func metricValue(t *testing.T, p *proc, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

// A TLS client that pipelines large fetches and never reads its answers
// does not hold the relay and its connection slot for ever: the relay's
// writes to it have the write-stall timeout, as the gnet side's have.
func TestTLSNeverReadingClientIsDropped(t *testing.T) {
	l := startTLSLab(t, "--write-stall-timeout", "1s")
	c, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "alice"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if _, err := c.CreateTopic(ctx, "big", nil); err != nil {
		t.Fatal(err)
	}
	p := c.NewProducer()
	for i := range 64 {
		if _, err := p.Send(ctx, &client.Message{Topic: "big", Value: make([]byte, 64<<10)}); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	p.Close(ctx)
	c.Close()
	checkFor(t, 10*time.Second, "the client's connection closed", func() error {
		if v := metricValue(t, l.p, "herald_tls_connections"); v != 0 {
			return fmt.Errorf("%v TLS connections", v)
		}
		return nil
	})
	cfg := l.clientTLS(t, l.file("ca.pem"), "alice")
	cfg.ServerName = "127.0.0.1"
	raw, err := tls.Dial("tcp", l.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var out []byte
	for i := range 100 {
		out, _ = heraldpb.AppendFrame(out, &heraldpb.Frame{Id: uint64(i + 1), Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "big", MaxBytes: 4 << 20}}})
	}
	if _, err := raw.Write(out); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, "the never-reading client counted", func() error {
		if v := metricValue(t, l.p, "herald_tls_connections"); v != 1 {
			return fmt.Errorf("%v TLS connections", v)
		}
		return nil
	})
	checkFor(t, 30*time.Second, "the never-reading client dropped", func() error {
		if v := metricValue(t, l.p, "herald_tls_connections"); v != 0 {
			return fmt.Errorf("%v TLS connections", v)
		}
		return nil
	})
}

// With TLS off, a cluster secret keeps out a process that does not know
// it: without it, or with another, it is refused (logged) and never
// registered; the nodes that share it work as a cluster.
func TestClusterSecret(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "secret"), filepath.Join(dir, "other")
	os.WriteFile(good, []byte("correct horse battery staple\n"), 0o600)
	os.WriteFile(bad, []byte("incorrect horse battery staple"), 0o600)
	tc, c := clusterWithTopic(t, "orders", 1, "--cluster-secret-file", good)
	if _, err := c.NewProducer().Send(ctxT(t, 15*time.Second), &client.Message{Topic: "orders", Value: []byte("v")}); err != nil {
		t.Fatalf("produce with the secret: %v", err)
	}
	refuseIntruders(t, tc, "refused a connection without the cluster secret", []intruder{
		{"no secret", nil},
		{"another secret", []string{"--cluster-secret-file", bad}},
	})
}

// A second process that claims a live node's id, from another address,
// does not take the node over: the controller refuses its registration
// (logged) and the node's record keeps the live member's address.
func TestNodeIDTakeoverRefused(t *testing.T) {
	tc := startCluster(t, 3)
	cv, _, err := getController(tc.nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	// The impostor claims a node that does not lead the controller: its
	// registration then goes to the leader (one claiming the leader's id
	// runs a replica of the same raft id and sends it nowhere).
	victim := uint64(1)
	for victim == cv.Leader {
		victim++
	}
	var live string
	for _, n := range cv.Nodes {
		if n.NodeID == victim {
			live = n.ClientAddress
		}
	}
	cl, health := pairPorts(t)
	// It names the others at their addresses, and itself as the victim.
	var peers []string
	for _, p := range tc.peers {
		if strings.HasPrefix(p, fmt.Sprintf("%d@", victim)) {
			p = fmt.Sprintf("%d@%s", victim, cl)
		}
		peers = append(peers, p)
	}
	cmd := exec.Command(heraldBin, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin", "",
		"--node-id", fmt.Sprint(victim), "--cluster", cl, "--cluster-health", health, "--peers", strings.Join(peers, ","))
	out := lockedWriter{new(sync.Mutex), new(strings.Builder)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	checkFor(t, 30*time.Second, "the controller refuses the impostor's registration", func() error {
		for _, q := range tc.nodes {
			if strings.Contains(q.logs(), "its node id is held by a live member") {
				return nil
			}
		}
		return fmt.Errorf("not refused (yet); the impostor:\n%s", tail(out.String(), 3000))
	})
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		cv, _, err := getController(tc.nodes[1])
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range cv.Nodes {
			if n.NodeID == victim && n.ClientAddress != live {
				t.Fatalf("node %d was taken over: registered at %s, the live node serves at %s\n%s", victim, n.ClientAddress, live, out.String())
			}
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
