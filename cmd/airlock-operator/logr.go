package main

import (
	"log/slog"

	"github.com/go-logr/logr"
)

// toLogr routes controller-runtime's logging to slog.
func toLogr(l *slog.Logger) logr.Logger { return logr.FromSlogHandler(l.Handler()) }
