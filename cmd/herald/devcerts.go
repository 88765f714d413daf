package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/heraldmq/herald/internal/tlsconf"
)

func init() {
	register("dev-certs", "write a development CA, server and client certificates for trying TLS (never for production)", cliRunner(devCertsCmd))
}

const devCertsUsage = "usage: herald dev-certs DIR [--host NAME,...] [--client NAME] [--nodes N]"

// devCertsCmd runs "herald dev-certs DIR".
func devCertsCmd(_ context.Context, args []string, io cliIO) error {
	fs := flag.NewFlagSet("herald dev-certs", flag.ContinueOnError)
	fs.SetOutput(io.err)
	hosts := fs.String("host", "", "more names and addresses for the server certificate, comma-separated (localhost, 127.0.0.1 and ::1 are always in it)")
	clientName := fs.String("client", "dev-client", "the client certificate's name (the principal it authenticates as)")
	nodes := fs.Int("nodes", 3, "node certificates to write, for node ids 1 to N (node-N.pem): each names its node id")
	fs.Usage = func() {
		fmt.Fprintln(io.err, devCertsUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("%s", devCertsUsage)
	}
	var extra []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			extra = append(extra, h)
		}
	}
	dir := pos[0]
	if *nodes < 0 || *nodes > 1000 {
		return usagef("--nodes %d: want 0 to 1000", *nodes)
	}
	if err := tlsconf.WriteDevCerts(dir, extra, *clientName, *nodes); err != nil {
		return cliOneLine(err)
	}
	for _, f := range tlsconf.DevCertFiles(*nodes) {
		fmt.Fprintln(io.out, filepath.Join(dir, f))
	}
	fmt.Fprintf(io.out, "serve:   herald serve --listen-tls 127.0.0.1:7443 --tls-cert %s --tls-key %s [--tls-client-ca %s]\n",
		filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem"))
	fmt.Fprintf(io.out, "connect: herald topic list --addr 127.0.0.1:7443 --tls-ca %s [--tls-cert %s --tls-key %s]\n",
		filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem"))
	return nil
}
