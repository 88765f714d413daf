// Command herald is the one Herald binary: the broker (serve) and its
// command-line clients (topic, produce, consume, group, dlq, bench).
//
// Exit codes: 0 on success, 1 on failure with a one-line reason on stderr,
// 2 on a usage error.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
)

// usageError marks an error as a usage error (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// commands maps each subcommand to its runner. Each runner parses its own
// flags from args (the words after the subcommand).
var commands = map[string]func(args []string) error{}

func register(name string, run func(args []string) error) { commands[name] = run }

func main() {
	os.Exit(profiled(func() int { return run(os.Args[1:]) }))
}

// profiled runs fn under a CPU profile written to $HERALD_CPUPROFILE, if
// set: a diagnostic for the client side of `herald bench` (the broker's
// profile is on its admin listener, /debug/pprof/profile).
func profiled(fn func() int) int {
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

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "herald: unknown command %q\n", args[0])
		printUsage()
		return 2
	}
	if err := cmd(args[1:]); err != nil {
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

func printUsage() {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(os.Stderr, "usage: herald <command> [flags]")
	fmt.Fprintln(os.Stderr, "commands:")
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %s\n", n)
	}
	fmt.Fprintln(os.Stderr, "run 'herald <command> -h' for a command's flags")
}
