package broker

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"github.com/heraldmq/herald/auth"
	heraldpb "github.com/heraldmq/herald/proto"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/heraldmq/herald/cluster"
	"github.com/heraldmq/herald/internal/tlsconf"
	"github.com/heraldmq/herald/netio"
)

// tlsWatchInterval is how often the TLS files are checked for changes.
const tlsWatchInterval = 2 * time.Second

// tlsState is the TLS listener and what reloads the certificates (the
// client listener's and the cluster's).
type tlsState struct {
	ln      *netio.TLSListener // nil without a TLS client listener
	admin   *tlsconf.Server    // the admin port's certificate (--admin-tls), nil without
	confs   []*tlsconf.Server
	stop    chan struct{}
	sighs   chan os.Signal
	done    chan struct{}
	started bool
}

// clusterTLS loads the node certificate and the cluster CA, when
// configured, for mutual TLS between nodes.
func (b *Broker) clusterTLS() (*cluster.TLS, error) {
	if b.cfg.ClusterTLSCert == "" {
		return nil, nil
	}
	conf, err := tlsconf.NewServer(tlsconf.ServerFiles{Cert: b.cfg.ClusterTLSCert, Key: b.cfg.ClusterTLSKey, ClientCA: b.cfg.ClusterTLSCA}, b.log)
	if err != nil {
		return nil, fmt.Errorf("cluster TLS: %w", err)
	}
	client, err := conf.PeerClient()
	if err != nil {
		return nil, fmt.Errorf("cluster TLS: %w", err)
	}
	b.tlsState().confs = append(b.tlsState().confs, conf)
	if leaf := conf.Leaf(); leaf != nil {
		if err := tlsconf.NamesNode(leaf, b.nodeID); err != nil {
			b.log.Warn("SECURITY: the node certificate does not name this node: the cluster's controller will refuse its registration; issue one with the URI urn:herald:node:ID (herald dev-certs writes node-ID.pem)",
				"node", b.nodeID, "cert", b.cfg.ClusterTLSCert, "err", err)
		}
	}
	b.nodeTLSClient = client
	return &cluster.TLS{Server: conf.ConfigWithALPN("h2", "http/1.1"), Client: client}, nil
}

// verifyNode proves that a registering node is the node it says: its
// cluster port and health endpoint both present a certificate of the
// cluster CA that names its node id (urn:herald:node:ID). So a process
// holding some node's certificate cannot register another node's id.
func (b *Broker) verifyNode(n *heraldpb.NodeRecord) error {
	for _, addr := range []string{n.ClusterAddress, n.HealthAddress} {
		if addr == "" {
			continue
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, b.nodeTLSClient)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		certs := conn.ConnectionState().PeerCertificates
		conn.Close()
		if len(certs) == 0 {
			return fmt.Errorf("%s presented no certificate", addr)
		}
		if err := tlsconf.NamesNode(certs[0], n.NodeId); err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
	}
	return nil
}

func (b *Broker) tlsState() *tlsState {
	if b.tls == nil {
		b.tls = &tlsState{stop: make(chan struct{}), sighs: make(chan os.Signal, 1), done: make(chan struct{})}
	}
	return b.tls
}

// startTLS starts the TLS client listener when one is configured (after
// the gnet listener, whose connections it relays to), and the reloading
// of every certificate: on SIGHUP, and when the files change.
func (b *Broker) startTLS() error {
	if b.cfg.ListenTLS != "" {
		conf, err := tlsconf.NewServer(tlsconf.ServerFiles{Cert: b.cfg.TLSCert, Key: b.cfg.TLSKey, ClientCA: b.cfg.TLSClientCA}, b.log)
		if err != nil {
			return err
		}
		ln, err := b.server.ListenTLS(b.cfg.ListenTLS, conf.Config())
		if err != nil {
			return fmt.Errorf("TLS listener %s: %w", b.cfg.ListenTLS, err)
		}
		t := b.tlsState()
		t.ln, t.confs = ln, append(t.confs, conf)
	}
	if b.cfg.AdminTLS {
		conf, err := tlsconf.NewServer(tlsconf.ServerFiles{Cert: b.cfg.TLSCert, Key: b.cfg.TLSKey}, b.log)
		if err != nil {
			return fmt.Errorf("admin TLS: %w", err)
		}
		t := b.tlsState()
		t.admin, t.confs = conf, append(t.confs, conf)
	}
	t := b.tls
	if t == nil {
		return nil
	}
	t.started = true
	signal.Notify(t.sighs, syscall.SIGHUP)
	go func() {
		defer close(t.done)
		tick := time.NewTicker(tlsWatchInterval)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				return
			case <-t.sighs:
				for _, c := range t.confs {
					c.ReloadAndLog("SIGHUP")
				}
			case <-tick.C:
				for _, c := range t.confs {
					if c.Changed() {
						c.ReloadAndLog("files changed")
					}
				}
			}
		}
	}()
	return nil
}

// TLSAddr is the TLS listener's bound address, or nil without one.
func (b *Broker) TLSAddr() net.Addr {
	if b.tls == nil || b.tls.ln == nil {
		return nil
	}
	return b.tls.ln.Addr()
}

// stopTLS closes the TLS listener and its connections, and stops the
// reloading.
func (b *Broker) stopTLS() {
	t := b.tls
	if t == nil || !t.started {
		return
	}
	t.started = false
	signal.Stop(t.sighs)
	close(t.stop)
	<-t.done
	if t.ln != nil {
		t.ln.Close()
	}
}

// tlsAddrString is the TLS address for the log: "" without a TLS listener.
func tlsAddrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// advertisedTLS is the TLS client address the controller registers for
// this node, which metadata gives to clients that use TLS: --advertise-tls,
// else the bound one ("" without a TLS listener).
func (b *Broker) advertisedTLS() string {
	if b.cfg.AdvertiseTLS != "" {
		return b.cfg.AdvertiseTLS
	}
	return tlsAddrString(b.TLSAddr())
}

// readClusterSecret reads the cluster secret file ("" = none).
func readClusterSecret(file string) ([]byte, error) {
	if file == "" {
		return nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < cluster.MinSecretBytes {
		return nil, fmt.Errorf("cluster secret %s: %d bytes, at least %d needed", file, len(b), cluster.MinSecretBytes)
	}
	return b, nil
}

// warnExposed logs, loudly, each listener reachable beyond loopback that
// lets anyone in: a client listener with logins off (or optional, which
// lets anonymous connections do everything until ACLs say otherwise), and
// the cluster port without mutual TLS or a cluster secret.
func (b *Broker) warnExposed() {
	if b.cfg.authMode != auth.Required && (exposed(b.cfg.Listen) || (b.cfg.ListenTLS != "" && exposed(b.cfg.ListenTLS))) {
		b.log.Warn("SECURITY: a client listener is reachable beyond this host and does not require a login (--auth "+b.cfg.authMode.String()+"): anyone who reaches it can read, write and delete every topic; set --auth required with users, or bind it to loopback (docs/security.md)",
			"listen", b.cfg.Listen, "listen_tls", b.cfg.ListenTLS)
	}
	if b.cfg.Cluster != "" && exposed(b.cfg.Cluster) && b.cfg.ClusterTLSCert == "" && b.cfg.ClusterSecretFile == "" {
		b.log.Warn("SECURITY: the cluster port is reachable beyond this host with neither mutual TLS nor a cluster secret: any process that reaches it can join the cluster; set --cluster-tls-* or --cluster-secret-file (docs/security.md)",
			"cluster", b.cfg.Cluster)
	}
}
