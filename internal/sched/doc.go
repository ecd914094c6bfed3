// Package sched starts processes at SCHED_IDLE and puts their threads back to normal scheduling: work made ahead of a call (a pool's refill) takes only CPU the calls leave idle.
package sched
