// Command herald-chaos runs Herald's chaos scenarios (chaos/scenario)
// against real herald processes and checks what the clients saw. It is a
// binary of its own so that the broker does not carry the plotting and
// fault tooling.
//
//	herald-chaos list
//	herald-chaos run SCENARIO [--herald PATH] [--nodes N] [--duration D] [--seed S] [--out DIR] [--client-log]
//	herald-chaos run --ci | --all [--seeds 1,2,3] ...
//
// Exit codes: 0 when every run's checker found no violation, 1 when one
// did (or a run could not be carried out), 2 on a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/heraldmq/herald/chaos"
	"github.com/heraldmq/herald/chaos/checker"
	"github.com/heraldmq/herald/chaos/scenario"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	switch {
	case len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, usage)
		return 0
	case args[0] == "list":
		err = list(stdout)
	case args[0] == "run":
		err = runCmd(ctx, args[1:], stdout, stderr)
	default:
		err = usageError{fmt.Sprintf("unknown command %q (want list or run)", args[0])}
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "herald-chaos: %v\n%s", err, usage)
		return 2
	default:
		fmt.Fprintf(stderr, "herald-chaos: %v\n", err)
		return 1
	}
}

const usage = `usage:
  herald-chaos list
  herald-chaos run SCENARIO [flags]     run one scenario
  herald-chaos run --ci [flags]         run the CI subset
  herald-chaos run --all [flags]        run every scenario (the matrix; with --seeds)
flags:
  --herald PATH     the herald binary, built with -tags chaos (default: ./herald)
  --nodes N         override the scenario's node count
  --duration D      override the scenario's duration of faults
  --seed S          the seed of random schedules and choices (default 1)
  --seeds 1,2,3     run each scenario once per seed
  --out DIR         where runs write their files (default: chaos-out/<time>)
  --client-log      write the workload clients' debug log to each run's clients.log
`

func list(w io.Writer) error {
	all, err := scenario.All()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tNODES\tDURATION\tCI\tDESCRIPTION")
	for _, s := range all {
		ci := ""
		if s.CI {
			ci = "yes"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", s.Name, s.Nodes, s.Duration.D(), ci, s.Description)
	}
	return tw.Flush()
}

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	herald := fs.String("herald", "./herald", "")
	nodes := fs.Int("nodes", 0, "")
	duration := fs.Duration("duration", 0, "")
	seed := fs.Uint64("seed", 1, "")
	seeds := fs.String("seeds", "", "")
	out := fs.String("out", "", "")
	ci := fs.Bool("ci", false, "")
	all := fs.Bool("all", false, "")
	clientLog := fs.Bool("client-log", false, "")
	var names []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) > 0 {
			names = append(names, args[0])
			args = args[1:]
		}
	}
	picked, err := pick(names, *ci, *all)
	if err != nil {
		return err
	}
	seedList := []uint64{*seed}
	if *seeds != "" {
		seedList = nil
		for _, f := range strings.Split(*seeds, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return usageError{fmt.Sprintf("--seeds %q: %v", *seeds, err)}
			}
			seedList = append(seedList, v)
		}
	}
	if _, err := os.Stat(*herald); err != nil {
		return usageError{fmt.Sprintf("--herald %s: %v (build it with: go build -tags chaos -o herald ./cmd/herald)", *herald, err)}
	}
	if *out == "" {
		*out = filepath.Join("chaos-out", time.Now().UTC().Format("20060102-150405"))
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tSEED\tOPS\tLOST\tDUPLICATED\tORDER\tLONGEST UNAVAILABLE\tRESULT")
	failed := 0
	for _, s := range picked {
		for _, sd := range seedList {
			dir := filepath.Join(*out, fmt.Sprintf("%s-seed%d", s.Name, sd))
			res, err := chaos.Run(ctx, chaos.Options{Scenario: s, Herald: *herald, Seed: sd, Duration: *duration, Nodes: *nodes, Out: dir, Progress: stderr, ClientLog: *clientLog})
			switch {
			case errors.Is(err, chaos.ErrUnsupported):
				fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\t-\tSKIPPED: %v\n", s.Name, sd, err)
				continue
			case err != nil:
				failed++
				fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\t-\tERROR: %v\n", s.Name, sd, err)
				continue
			}
			verdict := "ok"
			if !res.Valid() {
				failed++
				verdict = "VIOLATIONS (see " + filepath.Join(dir, "report.txt") + ")"
			} else if len(res.GoalsMissed) > 0 {
				verdict = "ok; goals missed: " + strings.Join(res.GoalsMissed, "; ")
			}
			r := res.Report
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%v\t%s\n", s.Name, sd, res.Ops, r.Section(checker.Lost).Count,
				r.Section(checker.Duplicated).Count, r.Section(checker.OrderProducer).Count+r.Section(checker.OrderKey).Count,
				r.Availability.Longest.Len().Round(time.Millisecond), verdict)
			if ctx.Err() != nil {
				break
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d run(s) failed; their reports are under %s", failed, *out)
	}
	return nil
}

// pick resolves the scenarios to run.
func pick(names []string, ci, all bool) ([]*scenario.Scenario, error) {
	if len(names) > 0 && (ci || all) || ci && all {
		return nil, usageError{"name scenarios, or give --ci or --all, not several"}
	}
	if len(names) == 0 && !ci && !all {
		return nil, usageError{"run needs a scenario name, --ci or --all"}
	}
	if len(names) > 0 {
		var out []*scenario.Scenario
		for _, n := range names {
			s, err := scenario.Find(n)
			if err != nil {
				return nil, usageError{err.Error()}
			}
			out = append(out, s)
		}
		return out, nil
	}
	everything, err := scenario.All()
	if err != nil {
		return nil, err
	}
	var out []*scenario.Scenario
	for _, s := range everything {
		if all || s.CI {
			out = append(out, s)
		}
	}
	return out, nil
}
