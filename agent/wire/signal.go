package wire

// linuxSignals numbers the signals by name as Linux does on amd64 and arm64, where the agent
// runs: a client on another system (darwin numbers SIGUSR1 30, not 10) must not use its own.
var linuxSignals = map[string]int{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6, "SIGBUS": 7,
	"SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13,
	"SIGALRM": 14, "SIGTERM": 15, "SIGSTKFLT": 16, "SIGCHLD": 17, "SIGCONT": 18, "SIGSTOP": 19,
	"SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22, "SIGURG": 23, "SIGXCPU": 24, "SIGXFSZ": 25,
	"SIGVTALRM": 26, "SIGPROF": 27, "SIGWINCH": 28, "SIGIO": 29, "SIGPWR": 30, "SIGSYS": 31,
}

// ShellExitCode is the exit status a shell reports for an exit: 128+n for a death by signal n
// (an Exit's negative ExitCode and its Signal name), else code as it is.
func ShellExitCode(code int, signal string) int {
	if n, ok := linuxSignals[signal]; ok && code < 0 {
		return 128 + n
	}
	return code
}
