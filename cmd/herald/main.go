// Command herald is the one Herald binary: the broker (serve) and its
// command-line clients (topic, produce, consume, group, dlq, bench).
//
// Exit codes: 0 on success, 1 on failure with a one-line reason on stderr,
// 2 on a usage error.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"text/tabwriter"
)

// usageError marks an error as a usage error (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// command is one subcommand: its one-line description for `herald --help`
// and its runner, which parses its own flags from args (the words after
// the subcommand).
type command struct {
	desc string
	run  func(args []string) error
}

// commands maps each subcommand's name to it.
var commands = map[string]command{}

// register adds a subcommand; desc is its line in `herald --help`.
func register(name, desc string, run func(args []string) error) {
	commands[name] = command{desc: desc, run: run}
}

func main() {
	os.Exit(profiled(func() int { return run(os.Args[1:]) }))
}

// profiled runs fn under a CPU profile written to $HERALD_CPUPROFILE, and
// records its allocations into $HERALD_MEMPROFILE (pprof's allocs
// profile, at the end), if set: diagnostics for the client side of
// `herald bench` (the broker's profiles are on its admin listener,
// /debug/pprof/).
func profiled(fn func() int) int {
	if path := os.Getenv("HERALD_MEMPROFILE"); path != "" {
		runtime.MemProfileRate = 64 << 10
		defer func() {
			f, err := os.Create(path)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "herald: HERALD_MEMPROFILE: %v\n", err)
			}
		}()
	}
	path := os.Getenv("HERALD_CPUPROFILE")
	if path == "" {
		return fn()
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "herald: HERALD_CPUPROFILE: %v\n", err)
		return 1
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "herald: HERALD_CPUPROFILE: %v\n", err)
		return 1
	}
	defer pprof.StopCPUProfile()
	return fn()
}

// run runs the command line args (without the program name) and returns
// the exit code. Asked for (-h, --help, help), the usage goes to stdout;
// without a command, or with an unknown one, to stderr with exit code 2.
func run(args []string) int {
	if len(args) == 0 {
		printUsage(os.Stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(os.Stdout)
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		fmt.Fprintf(os.Stderr, "herald: unknown command %q%s\n", args[0], didYouMean("", suggest(args[0], names)))
		printUsage(os.Stderr)
		return 2
	}
	if err := cmd.run(args[1:]); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(os.Stderr, "herald %s: %s\n", args[0], ue.msg)
			return 2
		}
		fmt.Fprintf(os.Stderr, "herald %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// printUsage lists the commands, each with its description.
func printUsage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: herald <command> [flags]")
	fmt.Fprintln(w, "commands:")
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, n := range names {
		fmt.Fprintf(tw, "  %s\t%s\n", n, commands[n].desc)
	}
	tw.Flush()
	fmt.Fprintln(w, "run 'herald <command> -h' for a command's flags")
}
