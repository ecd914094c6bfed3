package gcp

import (
	"fmt"
	"regexp"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// The launcher's grammar, in one place. Sources (notes/cloud-apis.md §3.2, §6.6):
//   - the CLI reference: "--" before the command on do, run and exec; --stdin=false without
//     stdin; exit 0 when the command succeeds and 1 on a CLI error or any non-zero exit of the
//     command; ids ^[a-zA-Z0-9][a-zA-Z0-9-]*$, "a user-given name (--sandbox-name)";
//   - two independent users that measured the live CLI (GoogleCloudPlatform/scion's
//     cloudrun-sandbox runtime and a TypeScript provider's probe) both name the sandbox as
//     run's first argument, `run NAME --detach ... -- cmd`, delete with --force (plain delete
//     refuses a running sandbox), and give the command's argv[0] as an absolute path (the
//     launcher resolves it before any PATH applies).
//
// alien's `run --id` appears in no documentation and no measured use, so it is not used.
// `run NAME` is what was measured; the fake launcher also accepts --sandbox-name, the
// documented spelling, so either reading of the reference parses there.

// launcherName is the documented sandbox id grammar.
var launcherName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9-]*$`)

// maxArg is Linux's limit on one argv string (MAX_ARG_STRLEN, 128 KiB with the NUL).
const maxArg = 128<<10 - 1

// runArgs is what a sandbox is started with.
type runArgs struct {
	name        string
	allowEgress bool // egress open: the launcher's only network switch
	workdir     string
	command     []string // argv[0] absolute
}

// argvRun starts a named sandbox in the background around command.
func argvRun(r runArgs) ([]string, error) {
	a := []string{"run", r.name, "--detach", "--write"}
	if r.allowEgress {
		a = append(a, "--allow-egress")
	}
	if r.workdir != "" {
		a = append(a, "--workdir", r.workdir)
	}
	a = append(a, "--")
	return checked(r.name, append(a, r.command...))
}

// argvExec runs command in a sandbox with the caller's stdio (stdin forwarded when stdin).
func argvExec(name string, stdin bool, command []string) ([]string, error) {
	a := []string{"exec", name}
	if !stdin {
		a = append(a, "--stdin=false")
	}
	a = append(a, "--")
	return checked(name, append(a, command...))
}

// argvDelete removes a sandbox, running or not; deleting an absent one succeeds.
func argvDelete(name string) ([]string, error) {
	return checked(name, []string{"delete", "--force", name})
}

// argvProbe answers whether a sandbox still runs commands: the launcher has no status verb.
func argvProbe(name string) ([]string, error) {
	return argvExec(name, false, []string{"/bin/true"})
}

// checked refuses a name outside the launcher's grammar and an argument Linux would refuse.
func checked(name string, argv []string) ([]string, error) {
	if !launcherName.MatchString(name) {
		return nil, fmt.Errorf("%w: launcher sandbox name %q: must match %s", sandbox.ErrInvalid, name, launcherName)
	}
	for i, s := range argv {
		if len(s) > maxArg {
			return nil, fmt.Errorf("%w: launcher argument %d is %d bytes: Linux refuses an argument longer than %d", sandbox.ErrInvalid, i, len(s), maxArg)
		}
	}
	return argv, nil
}
