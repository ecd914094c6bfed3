package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func init() { commands = append(commands, cli.Command{Names: []string{"image"}, New: newImageCmd}) }

// envAgentArm64 names the arm64 agent binary image push puts in a MicroVM image.
const envAgentArm64 = "AIRLOCK_AGENT_ARM64"

// agentArm64Name is the arm64 agent's file name next to this executable.
const agentArm64Name = "airlock-agent-linux-arm64"

func newImageCmd(g *cli.Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build the images a platform runs from declared ones",
		Args:  cli.NoArgs,
	}
	cmd.AddCommand(newImagePushCmd(g))
	return cmd
}

type imagePushFlags struct {
	platform, file, sandbox, ref            string
	name, image, bucket, key, role          string
	agent, base, baseVersion, connector, lg string
	memory                                  int
	timeout, poll                           time.Duration
}

func newImagePushCmd(g *cli.Globals) *cobra.Command {
	var f imagePushFlags
	cmd := &cobra.Command{
		Use:   "push --platform aws (-f FILE [--sandbox ID] | --ref REF) (--name NAME | --image ARN) [--bucket B] [--build-role ARN]",
		Short: "Build a declared image into what a platform runs (aws: a MicroVM image)",
		Long: `Build a declared image into what the platform runs. On aws: write a zip whose Dockerfile
starts FROM the declared image.ref and adds airlock's agent (built for arm64, the only
architecture Lambda MicroVMs offer), upload it to S3, build a MicroVM image from it
(CreateMicrovmImage with --name, or a new version of --image with UpdateMicrovmImage), show the
build's states until it ends, and print the image ARN, version and reference the aws section of
the config file takes (image, imageVersion, imageRef).

The image is the one declared by a stack file (-f; --sandbox picks one when its sandboxes declare
more than one) or --ref. Only a registry reference can be built: a host, directory, OCI layout,
tarball or snapshot image is refused. The agent is --agent, else $` + envAgentArm64 + `, else
` + agentArm64Name + ` next to this executable, else (on an arm64 machine) the agent airlock runs
with. Region, credentials, endpoints, bucket (aws.imageBucket) and build role (aws.buildRole)
come from the aws section and the SDK's default chain.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return imagePush(cmd, g, f) },
	}
	fl := cmd.Flags()
	cli.AddPlatform(fl, &f.platform)
	fl.StringVarP(&f.file, "file", "f", "", "stack file whose sandbox image to build")
	fl.StringVar(&f.sandbox, "sandbox", "", "the sandbox of the stack whose image to build (when they declare several)")
	fl.StringVar(&f.ref, "ref", "", "the image reference to build, instead of a stack file")
	fl.StringVar(&f.name, "name", "", "make a new MicroVM image of this name ([a-zA-Z0-9-_], at most 64)")
	fl.StringVar(&f.image, "image", "", "add a version to this existing MicroVM image (its ARN)")
	fl.StringVar(&f.bucket, "bucket", "", "S3 bucket the bundle is uploaded to (default aws.imageBucket)")
	fl.StringVar(&f.key, "key", "", "object key of the bundle (default airlock/images/NAME/SHA256.zip)")
	fl.StringVar(&f.role, "build-role", "", "ARN of the role the build assumes (default aws.buildRole)")
	fl.StringVar(&f.agent, "agent", "", "the arm64 airlock-agent binary to put in the image")
	fl.StringVar(&f.base, "base-image", "", "managed base image ARN (default the region's al2023-1)")
	fl.StringVar(&f.baseVersion, "base-image-version", "", "version of the managed base image (default its latest)")
	fl.StringVar(&f.connector, "build-connector", "", "egress connector the build pulls through (default the managed INTERNET_EGRESS)")
	fl.IntVar(&f.memory, "memory-mib", 0, "memory tier: 512, 1024, 2048, 4096 or 8192 MiB (default 2048)")
	fl.StringVar(&f.lg, "log-group", "", "CloudWatch log group for the build's and the guests' logs (default: logging off)")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Minute, "how long to wait for the build")
	fl.DurationVar(&f.poll, "poll", 5*time.Second, "interval between reads of the build's state")
	return cmd
}

func imagePush(cmd *cobra.Command, g *cli.Globals, f imagePushFlags) error {
	c, err := cli.PlatformSettings(cmd.Flags(), f.platform)
	if err != nil {
		return err
	}
	if c.Platform != string(capability.AWS) {
		return cli.UsageError("image push builds images for aws only (--platform aws); the platform is %s (from %s), where a sandbox runs its declared image as it is", c.Platform, c.From)
	}
	ref, err := pushRef(f)
	if err != nil {
		return err
	}
	if f.timeout <= 0 || f.poll <= 0 {
		return cli.UsageError("--timeout %v and --poll %v: both must be positive", f.timeout, f.poll)
	}
	agentPath, err := resolveArm64Agent(f.agent)
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: err}
	}
	agentBin, err := os.ReadFile(agentPath)
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("agent: %w", err)}
	}
	a := c.AWS
	o := awsb.PushOptions{Region: platform.AWSRegion(a), Endpoint: a.Endpoint, S3Endpoint: a.S3Endpoint,
		Ref: ref, Agent: agentBin, Name: f.name, Image: f.image, Bucket: or(f.bucket, a.ImageBucket), Key: f.key,
		BuildRole: or(f.role, a.BuildRole), BaseImage: f.base, BaseImageVersion: f.baseVersion, BuildConnector: f.connector,
		MemoryMiB: f.memory, LogGroup: f.lg, PollInterval: f.poll,
		Progress: func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), "image push: "+s) }}
	if o.Region == "" {
		return cli.UsageError("aws.region is not set (config file, $AWS_REGION): name the region to build the image in")
	}
	if o.Bucket == "" {
		return cli.UsageError("no bucket: give --bucket or set aws.imageBucket, the S3 bucket the bundle is uploaded to")
	}
	if o.BuildRole == "" {
		return cli.UsageError("no build role: give --build-role or set aws.buildRole, the role (trusted by lambda.amazonaws.com) the build assumes")
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	res, err := awsb.Push(ctx, o)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, sandbox.ErrUnsupported) {
			return &cli.ExitError{Code: cli.ExitUsage, Err: err}
		}
		return &cli.ExitError{Code: cli.ExitRefused, Err: err}
	}
	return printPush(cmd.OutOrStdout(), g.Output, res)
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// pushRef is the image reference to build: --ref, or the one the stack's sandboxes (or the
// one --sandbox names) declare.
func pushRef(f imagePushFlags) (string, error) {
	switch {
	case (f.file == "") == (f.ref == ""):
		return "", cli.UsageError("give the image to build: a stack file (-f) or a reference (--ref), one of them")
	case f.ref != "":
		if f.sandbox != "" {
			return "", cli.UsageError("--sandbox picks a sandbox of a stack file (-f)")
		}
		img, err := cli.ParseImage(f.ref)
		if err != nil {
			return "", cli.UsageError("--ref %q: %v", f.ref, err)
		}
		ref, err := awsb.BaseRef(img)
		if err != nil {
			return "", &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("--ref: %w", err)}
		}
		return ref, nil
	}
	st, err := spec.LoadStack(f.file)
	if err != nil {
		return "", &cli.ExitError{Code: cli.ExitUsage, Err: err}
	}
	var images []spec.Image
	var ids []string
	for _, sb := range st.Sandboxes {
		if f.sandbox != "" && sb.ID != f.sandbox {
			continue
		}
		ids = append(ids, sb.ID)
		if !slices.Contains(images, sb.Image) {
			images = append(images, sb.Image)
		}
	}
	switch {
	case f.sandbox != "" && len(ids) == 0:
		return "", cli.UsageError("%s has no sandbox %q", f.file, f.sandbox)
	case len(images) == 0:
		return "", cli.UsageError("%s declares no sandbox", f.file)
	case len(images) > 1:
		return "", cli.UsageError("%s: its sandboxes (%v) declare %d images, and an aws configuration runs one: pick a sandbox with --sandbox", f.file, ids, len(images))
	}
	ref, err := awsb.BaseRef(images[0])
	if err != nil {
		return "", &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("%s: sandbox %s: %w", f.file, ids[0], err)}
	}
	return ref, nil
}

// resolveArm64Agent finds the arm64 agent binary (see the command's help).
func resolveArm64Agent(opt string) (string, error) {
	if opt != "" {
		return opt, nil
	}
	if env := os.Getenv(envAgentArm64); env != "" {
		return env, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	next := filepath.Join(filepath.Dir(self), agentArm64Name)
	if _, err := os.Stat(next); err == nil {
		return next, nil
	}
	if runtime.GOARCH == "arm64" {
		// The agent this machine runs with is an arm64 one; this executable itself would need
		// "__agent" in the image's entrypoint, so it does not count.
		if p, args, err := statedir.ResolveAgent("", nil, func(string, fs.FileInfo) error { return nil }); err == nil && len(args) == 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("no arm64 agent binary (looked at --agent, $%s, %s): a MicroVM image needs airlock-agent built for arm64: CGO_ENABLED=0 GOOS=linux GOARCH=arm64 go build -o %s ./cmd/airlock-agent",
		envAgentArm64, next, agentArm64Name)
}

func printPush(w io.Writer, output string, res *awsb.PushResult) error {
	if output == cli.OutputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	_, err := fmt.Fprintf(w, "built %s version %s from %s (bundle %s)\nthe aws section of the config file runs it:\naws:\n  region: %s\n  image: %s\n  imageVersion: %s\n  imageRef: %s\n",
		res.Image, res.ImageVersion, res.ImageRef, res.CodeArtifact, res.Region, res.Image, strconv.Quote(res.ImageVersion), res.ImageRef)
	return err
}
