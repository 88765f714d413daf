package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	heraldpb "github.com/heraldmq/herald/proto"
)

func init() {
	register("acl", "access control rules: add, list, remove", cliRunner(aclCmd))
}

const aclUsage = "usage: herald acl add|remove --principal P --operation OP[,OP...] (--topic T | --group G | --transactional-id X | --producer-group G | --exchange X | --access-vhost V | --cluster) [--prefix] [--deny] | list [--principal P]"

// aclOps are the operations by their CLI names.
var aclOps = map[string]heraldpb.AclOperation{
	"all": heraldpb.AclOperation_ACL_OP_ALL, "produce": heraldpb.AclOperation_ACL_OP_PRODUCE,
	"consume": heraldpb.AclOperation_ACL_OP_CONSUME, "create": heraldpb.AclOperation_ACL_OP_CREATE,
	"delete": heraldpb.AclOperation_ACL_OP_DELETE, "alter": heraldpb.AclOperation_ACL_OP_ALTER,
	"describe": heraldpb.AclOperation_ACL_OP_DESCRIBE, "admin": heraldpb.AclOperation_ACL_OP_ADMIN,
}

// aclCmd runs "herald acl add|remove|list".
func aclCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("acl", io.err)
	principal := fs.String("principal", "", "user:NAME, group:NAME, user:* (any logged-in user) or anonymous")
	ops := fs.String("operation", "", "add, remove: comma-separated: produce, consume, create, delete, alter, describe, admin, all")
	topic := fs.String("topic", "", "add, remove: the rule is on this topic (with --prefix: the topics starting with it; * = all)")
	group := fs.String("group", "", "add, remove: the rule is on this consumer group")
	txnID := fs.String("transactional-id", "", "add, remove: the rule is on this transactional id")
	pgroup := fs.String("producer-group", "", "add, remove: the rule is on this producer group (half messages)")
	exchangeRes := fs.String("exchange", "", "add, remove: the rule is on this exchange")
	clusterRes := fs.Bool("cluster", false, "add, remove: the rule is on the cluster (admin, and listings)")
	vhostRes := fs.String("access-vhost", "", "add, remove: the rule is on this vhost (any operation lets the principal work in it)")
	prefix := fs.Bool("prefix", false, "add, remove: the name is a prefix")
	deny := fs.Bool("deny", false, "add, remove: a deny rule (wins over every allow)")
	fs.Usage = func() {
		fmt.Fprintln(io.err, aclUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one subcommand; %s", aclUsage)
	}
	sub := pos[0]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var rules []*heraldpb.AclRule
	switch sub {
	case "list":
		for _, f := range []string{"operation", "topic", "group", "transactional-id", "producer-group", "exchange", "access-vhost", "cluster", "prefix", "deny"} {
			if set[f] {
				return usagef("--%s is only for acl add and remove", f)
			}
		}
	case "add", "remove":
		if *principal == "" || *ops == "" {
			return usagef("acl %s needs --principal and --operation", sub)
		}
		var typ heraldpb.AclResourceType
		var name string
		n := 0
		for _, r := range []struct {
			flag string
			typ  heraldpb.AclResourceType
			val  string
		}{
			{"topic", heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, *topic},
			{"group", heraldpb.AclResourceType_ACL_RESOURCE_GROUP, *group},
			{"transactional-id", heraldpb.AclResourceType_ACL_RESOURCE_TRANSACTIONAL_ID, *txnID},
			{"producer-group", heraldpb.AclResourceType_ACL_RESOURCE_PRODUCER_GROUP, *pgroup},
			{"exchange", heraldpb.AclResourceType_ACL_RESOURCE_EXCHANGE, *exchangeRes},
			{"access-vhost", heraldpb.AclResourceType_ACL_RESOURCE_VHOST, *vhostRes},
		} {
			if set[r.flag] {
				typ, name = r.typ, r.val
				n++
			}
		}
		if *clusterRes {
			typ = heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER
			n++
		}
		if n != 1 {
			return usagef("acl %s needs exactly one of --topic, --group, --transactional-id, --producer-group, --exchange, --access-vhost, --cluster", sub)
		}
		for _, o := range strings.Split(*ops, ",") {
			op, ok := aclOps[strings.TrimSpace(o)]
			if !ok {
				return usagef("--operation %q: want produce, consume, create, delete, alter, describe, admin or all", o)
			}
			rules = append(rules, &heraldpb.AclRule{Principal: *principal, ResourceType: typ, Resource: name, Prefix: *prefix, Operation: op, Deny: *deny})
		}
	default:
		return usagef("unknown subcommand %q; %s", sub, aclUsage)
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	switch sub {
	case "add":
		if err := c.AlterAcls(ctx, rules, nil); err != nil {
			return cliOneLine(err)
		}
		for _, r := range rules {
			fmt.Fprintf(io.out, "added: %s\n", ruleString(r))
		}
	case "remove":
		if err := c.AlterAcls(ctx, nil, rules); err != nil {
			return cliOneLine(err)
		}
		for _, r := range rules {
			fmt.Fprintf(io.out, "removed: %s\n", ruleString(r))
		}
	case "list":
		rules, err := c.ListAcls(ctx, *principal)
		if err != nil {
			return cliOneLine(err)
		}
		if len(rules) == 0 {
			fmt.Fprintln(io.out, "no ACL rules")
			return nil
		}
		tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PRINCIPAL\tPERMISSION\tOPERATION\tRESOURCE\tNAME\tPATTERN")
		for _, r := range rules {
			perm, pattern := "allow", "literal"
			if r.Deny {
				perm = "deny"
			}
			if r.Prefix {
				pattern = "prefix"
			}
			name := r.Resource
			if name == "" {
				name = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Principal, perm, opName(r.Operation), resourceName(r.ResourceType), name, pattern)
		}
		return tw.Flush()
	}
	return nil
}

func opName(op heraldpb.AclOperation) string {
	return strings.ToLower(strings.TrimPrefix(op.String(), "ACL_OP_"))
}

func resourceName(t heraldpb.AclResourceType) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(t.String(), "ACL_RESOURCE_"), "_", "-"))
}

// ruleString is a rule in one line: "allow user:alice produce on topic
// orders".
func ruleString(r *heraldpb.AclRule) string {
	perm := "allow"
	if r.Deny {
		perm = "deny"
	}
	on := resourceName(r.ResourceType)
	if r.ResourceType != heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER {
		on += " " + r.Resource
		if r.Prefix {
			on += "*"
		}
	}
	return fmt.Sprintf("%s %s %s on %s", perm, r.Principal, opName(r.Operation), on)
}
