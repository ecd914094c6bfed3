// Package runcli is airlock run's command line and its run in a parked spare, shared by the full CLI and the lean front (cmd/airlock), which links nothing heavier.
package runcli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/cliexit"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/spec/imagearg"
)

const (
	// ExitRunFailed is airlock run's own failure (refused, no runtime, sandbox error), kept
	// apart from the program's statuses as docker run and coreutils timeout do.
	ExitRunFailed = 125
	// ExitInterrupted is a shell's status for SIGINT.
	ExitInterrupted = 130

	// EnvPool overrides --pool's default (0 parks none).
	EnvPool = "AIRLOCK_POOL"
	// envSpares was EnvPool's name; it is refused, naming EnvPool, rather than ignored.
	envSpares = "AIRLOCK_SPARES"
	// PoolFlag is --pool's name: how many sandboxes to keep ready, on every command that keeps
	// them (run parks them in the state dir, mcp holds them in its process).
	PoolFlag = "pool"
	// ImageHost is --image's value for the host image.
	ImageHost = imagearg.HostString
	// PlatformFlag is --platform's name (internal/cli declares it; the front reads it to hand
	// other platforms over).
	PlatformFlag = "platform"
)

// Flags are airlock run's own flags, on pflag so that the full CLI (cobra) and the front parse
// them with one definition.
type Flags struct {
	Lang        string
	Timeout     time.Duration
	Network     bool
	Image       string
	Files       []string
	Code        string
	Interactive bool
	MaxOutput   int64
	Pool        int
	// PoolMemory is --pool-memory as given ("": not given; the filler reads
	// $AIRLOCK_POOL_MEMORY, else the config file, else the default).
	PoolMemory string

	// spares is the removed --spares, declared hidden so that it is refused naming --pool.
	spares removedFlag
}

// removedFlag is a flag that was renamed: giving it is an error naming its new name.
type removedFlag struct{ set bool }

func (r *removedFlag) String() string   { return "" }
func (r *removedFlag) Set(string) error { r.set = true; return nil }
func (r *removedFlag) Type() string     { return "int" }

// Add declares run's flags on fs (--state-dir and --cgroup-parent are AddBackend's).
func (f *Flags) Add(fs *pflag.FlagSet) {
	fs.StringVarP(&f.Lang, "lang", "l", "", "language: python, node, bash (aliases py, python3, js, javascript, sh, shell); default python, or from FILE's extension")
	fs.DurationVar(&f.Timeout, "timeout", time.Duration(core.DefaultTimeoutSeconds)*time.Second, "wall-clock limit, whole seconds from 1s to 300s")
	fs.BoolVarP(&f.Network, "network", "n", false, "allow connections to the public internet")
	fs.StringVar(&f.Image, "image", ImageHost, `root filesystem: "host", a directory, an OCI layout ("oci:DIR"), a tarball, or an image reference`)
	fs.StringArrayVarP(&f.Files, "file", "f", nil, "copy LOCAL into the sandbox as REMOTE (default: its base name in /workspace); repeatable")
	fs.StringVarP(&f.Code, "code", "c", "", "the code to run")
	fs.BoolVarP(&f.Interactive, "interactive", "i", false, "feed standard input to the code")
	fs.Int64Var(&f.MaxOutput, "max-output", wire.DefaultOutputCap, "cap on each of stdout and stderr, in bytes")
	fs.IntVar(&f.Pool, PoolFlag, DefaultPool(), "sandboxes to keep parked for the next runs (0: none; default $"+EnvPool+", else 1)")
	fs.StringVar(&f.PoolMemory, core.PoolMemoryFlag, "", "the pool memory: host memory the parked sandboxes may hold as their count grows with the run rate (a quantity, e.g. 256Mi; 0: --pool alone; default $"+core.EnvPoolMemory+", else pool.memory in the config file, else "+core.PoolMemoryDefault+")")
	fs.Var(&f.spares, "spares", "renamed --"+PoolFlag)
	_ = fs.MarkHidden("spares")
}

// AddBackend declares the local runtime's flags (the full CLI's run, mcp and serve share them).
func AddBackend(fs *pflag.FlagSet, stateDir, cgroupParent *string) {
	fs.StringVar(stateDir, "state-dir", statedir.DefaultDirForUser(), "the local runtime's state directory (root's: "+statedir.DefaultDir+"; another user's: $XDG_RUNTIME_DIR/airlock)")
	// Two runtimes on one host keep apart by state dir; this names the cgroup explicitly (tests).
	fs.StringVar(cgroupParent, "cgroup-parent", "", "cgroup the sandboxes are created under (default derived from --state-dir)")
	_ = fs.MarkHidden("cgroup-parent")
}

// Output formats for the root's -o/--output.
const (
	OutputText = "text"
	OutputJSON = "json"
)

// RootFlags reads the root command's own flags at the start of args as cobra would: -o/--output
// (its only persistent flag) and its value (output; "" when not given), and at, the index of the
// first other argument (len(args) when none). ok is false when the last -o has no value.
func RootFlags(args []string) (output string, at int, ok bool) {
	for at < len(args) {
		a := args[at]
		switch {
		case a == "-o" || a == "--output":
			if at+1 >= len(args) {
				return output, at, false
			}
			output = args[at+1]
			at += 2
		case strings.HasPrefix(a, "--output="):
			output = strings.TrimPrefix(a, "--output=")
			at++
		case strings.HasPrefix(a, "-o"):
			output = strings.TrimPrefix(strings.TrimPrefix(a, "-o"), "=")
			at++
		default:
			return output, at, true
		}
	}
	return output, at, true
}

// DefaultPool is --pool's default: $AIRLOCK_POOL, else 1.
func DefaultPool() int {
	if _, ok := os.LookupEnv(envSpares); ok {
		return -1 // refused by Check, naming the new variable
	}
	if v, ok := os.LookupEnv(EnvPool); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		return -1 // refused by Check, naming the variable
	}
	return 1
}

// Check refuses flag values a run cannot have, as usage errors; poolChanged: --pool was
// given (else its value came from $AIRLOCK_POOL).
func (f *Flags) Check(poolChanged bool) error {
	if f.spares.set {
		return cliexit.UsageError("--spares is now --%s (sandboxes to keep parked for the next runs)", PoolFlag)
	}
	if _, ok := os.LookupEnv(envSpares); ok {
		return cliexit.UsageError("$%s is now $%s (sandboxes to keep parked for the next runs)", envSpares, EnvPool)
	}
	if f.MaxOutput < 1 {
		return cliexit.UsageError("--max-output %d must be at least 1 byte", f.MaxOutput)
	}
	if f.PoolMemory != "" {
		if _, err := core.ParsePoolMemory(f.PoolMemory); err != nil {
			return cliexit.UsageError("--%s: %v", core.PoolMemoryFlag, err)
		}
	} else if v, ok := os.LookupEnv(core.EnvPoolMemory); ok {
		if _, err := core.ParsePoolMemory(v); err != nil {
			return cliexit.UsageError("$%s: %v", core.EnvPoolMemory, err)
		}
	}
	if f.Pool < 0 || f.Pool > sessions.MaxParked {
		if !poolChanged {
			return cliexit.UsageError("$%s=%q: give 0 (none) to %d", EnvPool, os.Getenv(EnvPool), sessions.MaxParked)
		}
		return cliexit.UsageError("--pool %d must be 0 (none) to %d", f.Pool, sessions.MaxParked)
	}
	return nil
}

// Request builds the run request from the flags and the argument (the code's source); stdin is
// this process's standard input, and the returned reader what the code reads (nil: closed).
func (f *Flags) Request(args []string, stdin io.Reader) (core.Request, io.Reader, error) {
	req := core.Request{Language: f.Lang, Network: f.Network}
	var src, bigFile string
	if len(args) == 1 {
		src = args[0]
	}
	switch {
	case f.Code != "" && src != "":
		return req, nil, cliexit.UsageError("give the code once: -c CODE or a FILE (or - for standard input), not both")
	case f.Code != "":
		req.Code = f.Code
	case src == "-":
		if f.Interactive {
			return req, nil, cliexit.UsageError("-i feeds standard input to the code, but - reads the code itself from it: use -c CODE or a FILE with -i")
		}
		data, err := io.ReadAll(stdin)
		if err != nil {
			return req, nil, fmt.Errorf("reading the code from standard input: %w", err)
		}
		req.Code = string(data)
	case src != "":
		data, err := os.ReadFile(src)
		if err != nil {
			return req, nil, &cliexit.ExitError{Code: cliexit.ExitUsage, Err: fmt.Errorf("reading the code: %w", err)}
		}
		req.Code = string(data)
		bigFile = src
		if req.Language == "" {
			req.Language = languageFromExt(src)
			if req.Language == "" {
				return req, nil, cliexit.UsageError("cannot tell the language of %s from its extension: give --lang (%s)", src, strings.Join(core.LanguageNames(), ", "))
			}
		}
	default:
		return req, nil, cliexit.UsageError("no code to run: give -c CODE, a FILE, or - to read it from standard input")
	}
	if req.Language == "" {
		req.Language = string(core.Python)
	}
	if f.Timeout%time.Second != 0 || f.Timeout < time.Second {
		return req, nil, cliexit.UsageError("--timeout %v: give whole seconds from 1s to %ds", f.Timeout, core.MaxTimeoutSeconds)
	}
	if f.Timeout > core.MaxTimeoutSeconds*time.Second {
		// A flag the user typed is refused, not capped (run_code's tool caps what a model sends).
		return req, nil, cliexit.UsageError("--timeout %v is over the cap of %d seconds", f.Timeout, core.MaxTimeoutSeconds)
	}
	req.TimeoutSeconds = int(f.Timeout / time.Second)
	if len(f.Files) > 0 {
		req.Files = map[string][]byte{}
	}
	for _, fs := range f.Files {
		localPath, remote, ok := strings.Cut(fs, ":")
		if !ok || remote == "" {
			remote = filepath.Base(localPath)
		}
		if localPath == "" {
			return req, nil, cliexit.UsageError("--file %q: give LOCAL[:REMOTE]", fs)
		}
		if _, dup := req.Files[remote]; dup {
			return req, nil, cliexit.UsageError("--file %q: %s is already the target of another --file", fs, remote)
		}
		data, err := os.ReadFile(localPath)
		if err != nil {
			return req, nil, &cliexit.ExitError{Code: cliexit.ExitUsage, Err: fmt.Errorf("--file %q: %w", fs, err)}
		}
		req.Files[remote] = data
	}
	if bigFile != "" && len(req.Code) > core.MaxCodeBytes {
		// The code cap bounds a program sent as text; a FILE larger than it goes as a file,
		// which nothing but the disk bounds, and the code runs it.
		if err := runAsFile(&req, bigFile); err != nil {
			return req, nil, err
		}
	}
	var in io.Reader
	if f.Interactive {
		in = stdin
	}
	req, err := core.Normalize(req)
	if err != nil {
		return req, nil, cliexit.UsageError("%v", err)
	}
	return req, in, nil
}

// runAsFile moves req's code (read from FILE src) into req.Files under src's name and makes
// the code a one-line runner of that file.
func runAsFile(req *core.Request, src string) error {
	l, err := core.ParseLanguage(req.Language)
	if err != nil {
		return cliexit.UsageError("%v", err)
	}
	codeFile, _ := core.Program(l)
	name := filepath.Base(src)
	if name == codeFile || name == "." || name == "/" {
		name = "program" + filepath.Ext(codeFile)
	}
	if _, dup := req.Files[name]; dup {
		return cliexit.UsageError("%s is over the code cap of %d bytes and goes into the sandbox as the file %s, which a --file already names", src, core.MaxCodeBytes, name)
	}
	if req.Files == nil {
		req.Files = map[string][]byte{}
	}
	req.Files[name] = []byte(req.Code)
	req.Code = core.Runner(l, name)
	return nil
}

func languageFromExt(p string) string {
	switch strings.ToLower(filepath.Ext(p)) {
	case ".py":
		return string(core.Python)
	case ".js", ".cjs":
		return string(core.Node)
	case ".sh", ".bash":
		return string(core.Bash)
	}
	return ""
}

// Image is an --image value the front runs without the image package: the host image or a
// directory.
type Image struct {
	// Key names the image among the parked sandboxes' aliases ("host", "dir:/abs/path"), as ImageKey.
	Key string
	// JSON is the image as a JSON string (spec.Image reads that form), for the filler's
	// --image-json.
	JSON string
}

// LightImage reads --image's value when it is the host image or a directory (a directory made
// absolute, as the full CLI does). ok is false for any other image (an OCI layout, a tarball,
// a reference), which only the full CLI reads.
func LightImage(s string) (img Image, ok bool) {
	var dir string
	switch k, v := imagearg.Parse(s); k {
	case imagearg.Host:
	case imagearg.Dir:
		abs, err := filepath.Abs(v)
		if err != nil {
			return Image{}, false
		}
		dir, s = abs, abs
	default:
		return Image{}, false
	}
	b, err := json.Marshal(s)
	if err != nil {
		return Image{}, false
	}
	return Image{Key: ImageKey(dir == "", dir), JSON: string(b)}, true
}

// ImageKey names an image among the parked sandboxes' aliases: "host" or "dir:" and its absolute path.
func ImageKey(host bool, dir string) string {
	if host {
		return ImageHost
	}
	return "dir:" + dir
}

// Notes tells the person why the code ended, when its output cannot.
func Notes(w io.Writer, res core.Result) {
	switch {
	case res.TimedOut:
		fmt.Fprintf(w, "airlock: timed out after %ds: the code and everything it started were killed\n", res.TimeoutSeconds)
	case res.OOMKilled:
		fmt.Fprintf(w, "airlock: killed: out of memory (limit %s)\n", res.Memory)
	case res.Signal != "":
		fmt.Fprintf(w, "airlock: killed by signal %s\n", res.Signal)
	}
	if res.Truncated {
		fmt.Fprintf(w, "airlock: output truncated at %d bytes per stream (--max-output)\n", res.OutputCapBytes)
	}
}

// Report writes the result as the run's output format asks (json: the whole result; text: the
// notes, the output having been streamed) and returns the exit status.
func Report(stdout, stderr io.Writer, jsonOut bool, res core.Result) (int, error) {
	if jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return cliexit.ExitRefused, err
		}
	} else {
		Notes(stderr, res)
	}
	return res.ExitStatus(), nil
}
