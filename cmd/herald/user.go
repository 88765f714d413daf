package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"golang.org/x/term"
)

func init() {
	register("user", "users who log in (SCRAM-SHA-256): add, list, passwd, groups, quota, delete", cliRunner(userCmd))
}

const userUsage = "usage: herald user add NAME [--new-password-file F] [--iterations N] [--groups G,...] | list | passwd NAME [--new-password-file F] | groups NAME --groups G,... | quota NAME [--produce-rate B] [--consume-rate B] [--max-connections N] [--max-topics N] [--max-partitions N] [--max-stored-bytes B] | delete NAME"

// userCmd runs "herald user add|list|passwd|delete". The new password is
// read from --new-password-file, else prompted for on a terminal (twice,
// without echo), else read as the first line of standard input. The CLI
// derives the salted credentials itself: the password never leaves it.
func userCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("user", io.err)
	newPW := fs.String("new-password-file", "", "add, passwd: file whose first line is the new password (default: prompt, or the first line of standard input)")
	iters := fs.Int("iterations", 0, "add, passwd: PBKDF2 iterations of the stored credentials (default 8192, at least 4096)")
	q := addQuotaFlags(fs, true)
	groups := fs.String("groups", "", "add, groups: comma-separated groups of the user (ACL principals group:NAME)")
	fs.Usage = func() {
		fmt.Fprintln(io.err, userUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", userUsage)
	}
	sub, rest := pos[0], pos[1:]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch sub {
	case "list":
		if len(rest) > 0 {
			return usagef("user list takes no arguments")
		}
	case "add", "passwd", "delete", "groups", "quota":
		if len(rest) != 1 {
			return usagef("user %s needs exactly one NAME", sub)
		}
	default:
		return usagef("unknown subcommand %q; %s", sub, userUsage)
	}
	for _, f := range []string{"produce-rate", "consume-rate", "max-connections", "max-topics", "max-partitions", "max-stored-bytes"} {
		if set[f] && sub != "quota" {
			return usagef("--%s is only for user quota", f)
		}
	}
	if sub == "list" || sub == "delete" || sub == "groups" || sub == "quota" {
		for _, f := range []string{"new-password-file", "iterations"} {
			if set[f] {
				return usagef("--%s is only for user add and passwd", f)
			}
		}
	}
	if set["groups"] && sub != "add" && sub != "groups" {
		return usagef("--groups is only for user add and groups")
	}
	if sub == "groups" && !set["groups"] {
		return usagef("user groups needs --groups (empty: none)")
	}
	var groupList []string
	for _, g := range strings.Split(*groups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			groupList = append(groupList, g)
		}
	}
	var password string
	if sub == "add" || sub == "passwd" {
		if password, err = newPassword(*newPW, rest[0], io); err != nil {
			return err
		}
		// Fail here on a name or password SCRAM refuses, before dialling.
		if _, err := client.NewSCRAMCredential(rest[0], password, *iters); err != nil {
			return usagef("%v", err)
		}
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	switch sub {
	case "list":
		users, err := c.ListUsers(ctx)
		if err != nil {
			return cliOneLine(err)
		}
		if len(users) == 0 {
			fmt.Fprintln(io.out, "no users")
			return nil
		}
		tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "USER\tMECHANISMS\tITERATIONS\tSUPERUSER\tGROUPS\tCHANGED")
		for _, u := range users {
			g := strings.Join(u.Groups, ",")
			if g == "" {
				g = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%s\t%s\n", u.Name, strings.Join(u.Mechanisms, ","), u.Iterations, u.Superuser, g,
				time.UnixMilli(u.UpdatedMs).UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	case "add":
		cred, err := client.NewSCRAMCredential(rest[0], password, *iters)
		if err != nil {
			return usagef("%v", err)
		}
		if err := c.AlterUser(ctx, &heraldpb.AlterUserRequest{Name: rest[0], ScramSha256: cred, Create: true, Groups: groupList}); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "created user %s\n", rest[0])
	case "quota":
		if err := c.SetUserQuotas(ctx, rest[0], q.wire()); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "user %s quotas: %s\n", rest[0], quotaText(q.wire()))
	case "groups":
		if err := c.SetUserGroups(ctx, rest[0], groupList); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "user %s is in groups [%s]\n", rest[0], strings.Join(groupList, ","))
	case "passwd":
		if err := c.SetPassword(ctx, rest[0], password, *iters); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "changed the password of user %s\n", rest[0])
	case "delete":
		if err := c.DeleteUser(ctx, rest[0]); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "deleted user %s\n", rest[0])
	}
	return nil
}

// newPassword reads a new password: from file, else from the terminal
// (asked twice, not echoed), else the first line of standard input.
func newPassword(file, user string, io cliIO) (string, error) {
	if file != "" {
		return readFirstLine(file)
	}
	if f, ok := io.in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprintf(io.err, "new password for %s: ", user)
		a, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(io.err)
		if err != nil {
			return "", err
		}
		fmt.Fprint(io.err, "again: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(io.err)
		if err != nil {
			return "", err
		}
		if string(a) != string(b) {
			return "", usagef("the passwords differ")
		}
		if len(a) == 0 {
			return "", usagef("the password is empty")
		}
		return string(a), nil
	}
	line, err := bufio.NewReader(io.in).ReadString('\n')
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		if err != nil {
			return "", usagef("no password: give --new-password-file, or the password on standard input")
		}
		return "", usagef("the password is empty")
	}
	return line, nil
}
