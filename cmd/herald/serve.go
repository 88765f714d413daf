package main

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/heraldmq/herald/broker"
)

func init() { register("serve", "run the broker", runServe) }

func runServe(args []string) error {
	cfg, err := loadServeConfig(args, os.Getenv)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	level, _ := broker.ParseLevel(cfg.LogLevel)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(logger)

	b, err := broker.Start(*cfg, logger)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	sig := <-sigs
	logger.Info("shutting down", "signal", sig.String())
	return b.Shutdown()
}
