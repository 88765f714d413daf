package broker

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/heraldmq/herald/internal/tlsconf"
	"github.com/heraldmq/herald/netio"
)

// tlsWatchInterval is how often the TLS files are checked for changes.
const tlsWatchInterval = 2 * time.Second

// tlsState is the TLS listener and what reloads its certificates.
type tlsState struct {
	ln    *netio.TLSListener
	conf  *tlsconf.Server
	stop  chan struct{}
	sighs chan os.Signal
	done  chan struct{}
}

// startTLS starts the TLS client listener when one is configured: after
// the gnet listener, whose connections it relays to.
func (b *Broker) startTLS() error {
	if b.cfg.ListenTLS == "" {
		return nil
	}
	conf, err := tlsconf.NewServer(tlsconf.ServerFiles{Cert: b.cfg.TLSCert, Key: b.cfg.TLSKey, ClientCA: b.cfg.TLSClientCA}, b.log)
	if err != nil {
		return err
	}
	ln, err := b.server.ListenTLS(b.cfg.ListenTLS, conf.Config())
	if err != nil {
		return fmt.Errorf("TLS listener %s: %w", b.cfg.ListenTLS, err)
	}
	t := &tlsState{ln: ln, conf: conf, stop: make(chan struct{}), sighs: make(chan os.Signal, 1), done: make(chan struct{})}
	signal.Notify(t.sighs, syscall.SIGHUP)
	go func() {
		defer close(t.done)
		go conf.Watch(tlsWatchInterval, t.stop)
		for {
			select {
			case <-t.stop:
				return
			case <-t.sighs:
				conf.ReloadAndLog("SIGHUP")
			}
		}
	}()
	b.tls = t
	return nil
}

// TLSAddr is the TLS listener's bound address, or nil without one.
func (b *Broker) TLSAddr() net.Addr {
	if b.tls == nil {
		return nil
	}
	return b.tls.ln.Addr()
}

// stopTLS closes the TLS listener and its connections.
func (b *Broker) stopTLS() {
	if b.tls == nil {
		return
	}
	signal.Stop(b.tls.sighs)
	close(b.tls.stop)
	<-b.tls.done
	b.tls.ln.Close()
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
