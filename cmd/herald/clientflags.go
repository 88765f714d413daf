package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/tlsconf"
	heraldpb "github.com/heraldmq/herald/proto"
)

// cliDefaultAddr is the broker address client commands use without --addr or
// HERALD_ADDR.
const cliDefaultAddr = "127.0.0.1:7420"

// cliIO is where a client command reads and writes, so tests can run
// commands in-process.
type cliIO struct {
	in       io.Reader
	out, err io.Writer
}

func cliOSIO() cliIO { return cliIO{os.Stdin, os.Stdout, os.Stderr} }

// errCLIHelp means -h was given: usage is printed and the command succeeds.
var errCLIHelp = errors.New("help requested")

// cliFlags are the flags every client command takes.
type cliFlags struct {
	addr    string
	timeout time.Duration
	// connect is how long dial waits for a broker to be reachable: a
	// command run right after a broker (re)starts waits for it to listen.
	connect time.Duration
	// TLS: any of these set connects with TLS (to --listen-tls).
	tls tlsconf.ClientFiles
	// Login (SCRAM-SHA-256): the user, and the file holding the password
	// (or HERALD_PASSWORD).
	user, passwordFile string
	// vhost is the vhost (tenant) to work in ("" = the default).
	vhost string
}

// newCLIFlagSet returns a flag set with the common client flags.
func newCLIFlagSet(name string, w io.Writer) (*flag.FlagSet, *cliFlags) {
	fs := flag.NewFlagSet("herald "+name, flag.ContinueOnError)
	fs.SetOutput(w)
	cf := &cliFlags{}
	addr := os.Getenv("HERALD_ADDR")
	if addr == "" {
		addr = cliDefaultAddr
	}
	fs.StringVar(&cf.addr, "addr", addr, "broker `HOST:PORT[,HOST:PORT...]` (env HERALD_ADDR)")
	fs.DurationVar(&cf.timeout, "timeout", client.DefaultRequestTimeout, "per-request timeout")
	fs.DurationVar(&cf.connect, "connect-timeout", 5*time.Second, "how long to wait for a broker to be reachable (a broker still starting)")
	fs.StringVar(&cf.tls.CA, "tls-ca", os.Getenv("HERALD_TLS_CA"), "connect with TLS, trusting the broker certificates this PEM CA bundle signs (env HERALD_TLS_CA)")
	fs.StringVar(&cf.tls.Cert, "tls-cert", os.Getenv("HERALD_TLS_CERT"), "connect with TLS, presenting this PEM client certificate (env HERALD_TLS_CERT)")
	fs.StringVar(&cf.tls.Key, "tls-key", os.Getenv("HERALD_TLS_KEY"), "the PEM private key of --tls-cert (env HERALD_TLS_KEY)")
	fs.StringVar(&cf.tls.ServerName, "tls-server-name", os.Getenv("HERALD_TLS_SERVER_NAME"), "the name to check the broker's certificate against (default: the host of --addr)")
	fs.StringVar(&cf.user, "user", os.Getenv("HERALD_USER"), "log in as this user (SCRAM-SHA-256; env HERALD_USER), with the password from --password-file or HERALD_PASSWORD")
	fs.StringVar(&cf.passwordFile, "password-file", os.Getenv("HERALD_PASSWORD_FILE"), "file whose first line is --user's password (env HERALD_PASSWORD_FILE)")
	fs.StringVar(&cf.vhost, "vhost", os.Getenv("HERALD_VHOST"), "the vhost (tenant) to work in (env HERALD_VHOST; default: the default vhost /)")
	return fs, cf
}

// clientOptions are the client options the flags ask for.
func (cf *cliFlags) clientOptions() ([]client.Option, error) {
	opts := []client.Option{client.WithClientID("herald-cli"), client.WithRequestTimeout(cf.timeout)}
	if cf.tls != (tlsconf.ClientFiles{}) {
		cfg, err := tlsconf.Client(cf.tls)
		if err != nil {
			return nil, usagef("%v", err)
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if cf.vhost != "" {
		opts = append(opts, client.WithVhost(cf.vhost))
	}
	switch {
	case cf.user != "":
		pw, err := cf.password()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithSCRAM(cf.user, pw))
	case cf.passwordFile != "":
		return nil, usagef("--password-file needs --user")
	}
	return opts, nil
}

// password is --user's password: the first line of --password-file, or
// HERALD_PASSWORD. Never a flag: command lines are visible to every user
// of the machine.
func (cf *cliFlags) password() (string, error) {
	if cf.passwordFile == "" {
		if pw := os.Getenv("HERALD_PASSWORD"); pw != "" {
			return pw, nil
		}
		return "", usagef("--user %s needs its password in --password-file or HERALD_PASSWORD", cf.user)
	}
	return readFirstLine(cf.passwordFile)
}

// readFirstLine is the first line of path (a password file).
func readFirstLine(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", usagef("%v", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	line = strings.TrimSuffix(line, "\r")
	if line == "" {
		return "", usagef("%s: the first line is empty", path)
	}
	return line, nil
}

// parseCLIArgs parses args allowing flags and positional arguments in any
// order (herald topic create NAME --partitions 3), and returns the
// positional ones. Parse errors become one-line usage errors (an unknown
// flag with the nearest known one, see flagParseError) without the flag
// package's usage dump; -h prints the usage.
func parseCLIArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseQuietly(fs, args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errCLIHelp
			}
			return nil, flagParseError(fs, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseCLIFlags parses a command that takes flags only: it refuses
// positional arguments. Every failure is a usage error.
func parseCLIFlags(fs *flag.FlagSet, args []string) error {
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	return nil
}

// dial connects to the brokers named by --addr.
func (cf *cliFlags) dial(ctx context.Context) (*client.Client, error) {
	if strings.TrimSpace(cf.addr) == "" {
		return nil, usagef("--addr is empty")
	}
	opts, err := cf.clientOptions()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(cf.connect)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		c, err := client.Dial(ctx, cf.addr, opts...)
		if err == nil || !errors.Is(err, client.ErrNoBrokers) || time.Now().Add(wait).After(deadline) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// cliRunner runs fn with a context cancelled by SIGINT or SIGTERM and
// the process's standard streams, and maps errCLIHelp to success.
func cliRunner(fn func(ctx context.Context, args []string, io cliIO) error) func([]string) error {
	return func(args []string) error {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err := fn(ctx, args, cliOSIO())
		if errors.Is(err, errCLIHelp) {
			return nil
		}
		return err
	}
}

// cliOneLine flattens an error message to one line for stderr.
func cliOneLine(err error) error {
	if err == nil {
		return nil
	}
	s := err.Error()
	if !strings.ContainsAny(s, "\r\n") {
		return err
	}
	return errors.New(strings.Join(strings.Fields(s), " "))
}

// parseCLIAcks maps --acks to the wire value.
func parseCLIAcks(s string) (cliAcks, error) {
	switch s {
	case "all", "":
		return cliAcksAll, nil
	case "leader":
		return cliAcksLeader, nil
	case "none":
		return cliAcksNone, nil
	}
	return 0, usagef("--acks must be none, leader or all, not %q", s)
}

func cliBytes(n float64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", n/(1<<10))
	}
	return fmt.Sprintf("%.0f B", n)
}

type cliAcks = heraldpb.Acks

const (
	cliAcksAll    = client.AcksAll
	cliAcksLeader = client.AcksLeader
	cliAcksNone   = client.AcksNone
)

// cliTopicErr is cliOneLine(err) with, when the broker said that the topic
// does not exist (TOPIC_NOT_FOUND), how to create it: "...; create it with:
// herald topic create NAME --partitions N". topic "" prints NAME, and
// partitions 0 prints N.
func cliTopicErr(err error, topic string, partitions int) error {
	if client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		name, n := topic, "N"
		if name == "" {
			name = "NAME"
		}
		if partitions > 0 {
			n = strconv.Itoa(partitions)
		}
		err = fmt.Errorf("%w; create it with: herald topic create %s --partitions %s", err, name, n)
	}
	return cliOneLine(err)
}
