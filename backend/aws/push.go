package aws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// PushOptions say what image to build and where: the declared reference, our agent for the
// image's architecture, the S3 object the bundle goes to, and the image (a new one by Name, or
// a new version of an existing one by Image).
type PushOptions struct {
	// Region is the image's (and the bucket's) region; Endpoint and S3Endpoint override the
	// MicroVM API's and S3's URLs (a fake, VPC endpoints; S3 is then addressed path-style).
	Region     string
	Endpoint   string
	S3Endpoint string
	// Credentials sign both services (default: the SDK's default chain, as the backend's).
	Credentials awssdk.CredentialsProvider
	HTTPClient  *http.Client

	// Ref is the declared image.ref the Dockerfile starts FROM (see BaseRef).
	Ref string
	// Agent is the airlock-agent binary the image serves its hooks and protocol with.
	Agent []byte
	// Name makes a new image (CreateMicrovmImage); Image adds a version to an existing one
	// (UpdateMicrovmImage). Exactly one.
	Name  string
	Image string
	// Bucket and Key are where the bundle goes (Key default airlock/images/<name>/<sha256>.zip).
	Bucket string
	Key    string
	// BuildRole is the role the build assumes (trusted by lambda.amazonaws.com, may read the
	// bundle).
	BuildRole string
	// BaseImage and BaseImageVersion are the managed base the build layers on (default
	// ManagedBaseImage(Region), its latest version).
	BaseImage        string
	BaseImageVersion string
	// BuildConnector is the egress connector the build pulls through (default
	// InternetEgressConnector(Region)).
	BuildConnector string
	// MemoryMiB is the image's memory tier (default DefaultImageMemoryMiB).
	MemoryMiB int
	// LogGroup, when set, is the CloudWatch log group the image's build and guests log to.
	LogGroup string
	// PollInterval is between reads of the build's state (default 5 s).
	PollInterval time.Duration
	// PartSize and MultipartThreshold tune the upload (defaults: the transfer manager's).
	PartSize           int64
	MultipartThreshold int64
	// Progress receives a line per step and per build state change.
	Progress func(string)
}

// PushResult is what a push made: Image, ImageVersion and ImageRef are the aws config
// section's image, imageVersion and imageRef.
type PushResult struct {
	Image        string `json:"image"`
	ImageVersion string `json:"imageVersion"`
	ImageRef     string `json:"imageRef"`
	Region       string `json:"region"`
	CodeArtifact string `json:"codeArtifact"`
	BundleBytes  int    `json:"bundleBytes"`
	BundleSHA256 string `json:"bundleSha256"`
	State        string `json:"state"`
	Status       string `json:"status"`
	LogGroup     string `json:"logGroup,omitempty"`
}

// BuildFailedError is a build the service ended FAILED, with its reasons (the version's and
// each build attempt's).
type BuildFailedError struct {
	Image, Version string
	Reason         string
	Builds         []ImageBuild
}

func (e *BuildFailedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "image %s version %s: build FAILED", e.Image, e.Version)
	if e.Reason != "" {
		fmt.Fprintf(&b, ": %s", e.Reason)
	}
	for _, x := range e.Builds {
		if x.StateReason == "" && x.TerminationReasonCode == "" {
			continue
		}
		fmt.Fprintf(&b, "; build %s (%s %s%s)", x.BuildID, x.Architecture, x.Chipset, x.ChipsetGeneration)
		if x.TerminationReasonCode != "" {
			fmt.Fprintf(&b, " %s", x.TerminationReasonCode)
		}
		if x.StateReason != "" {
			fmt.Fprintf(&b, ": %s", x.StateReason)
		}
	}
	return b.String()
}

// Unwrap is refused: the service would not build the image.
func (e *BuildFailedError) Unwrap() error { return sandbox.ErrRefused }

func (o *PushOptions) check() error {
	bad := func(field, value, msg string) error {
		return fmt.Errorf("%w: %s %q: %s", sandbox.ErrInvalid, field, value, msg)
	}
	if o.Region == "" {
		return fmt.Errorf("%w: aws.region is not set: name the region the image is built in", sandbox.ErrInvalid)
	}
	switch {
	case (o.Name == "") == (o.Image == ""):
		return fmt.Errorf("%w: name the image to make (a new image's name) or the image to add a version to (its ARN), not both or neither", sandbox.ErrInvalid)
	case o.Name != "":
		if err := CheckImageName(o.Name); err != nil {
			return err
		}
	default:
		if err := CheckImageArn(o.Image); err != nil {
			return err
		}
		if r := ImageRegion(o.Image); r != o.Region {
			return bad("image", o.Image, "is in region "+r+", and the push signs for "+o.Region+" (a request signed for another region is a 404)")
		}
	}
	if !bucketRE().MatchString(o.Bucket) || strings.Contains(o.Bucket, "..") {
		return bad("bucket", o.Bucket, "an S3 bucket name is 3 to 63 of [a-z0-9.-], starting and ending with a letter or digit")
	}
	if o.Key != "" && (strings.HasPrefix(o.Key, "/") || len(o.Key) > 1024 || !strings.HasSuffix(o.Key, ".zip")) {
		return bad("key", o.Key, "an object key ending in .zip, not starting with /, at most 1024 bytes")
	}
	if !roleArn(o.BuildRole) {
		return bad("buildRole", o.BuildRole, "the build role's ARN (arn:aws:iam::<account>:role/<name>), a role lambda.amazonaws.com may assume that may read the bundle")
	}
	if o.BaseImage != "" && !strings.HasPrefix(o.BaseImage, "arn:") {
		return bad("baseImage", o.BaseImage, "a managed base image's ARN, e.g. "+ManagedBaseImage(o.Region))
	}
	if o.BuildConnector != "" && !strings.HasPrefix(o.BuildConnector, "arn:") {
		return bad("buildConnector", o.BuildConnector, "a network connector's ARN")
	}
	if o.MemoryMiB != 0 && !tierMiB(o.MemoryMiB) {
		return bad("memory", fmt.Sprint(o.MemoryMiB), "a MicroVM memory tier: 512, 1024, 2048, 4096 or 8192 MiB")
	}
	return nil
}

func tierMiB(n int) bool {
	switch n {
	case 512, 1024, 2048, 4096, 8192:
		return true
	}
	return false
}

// Push builds a MicroVM image from a declared reference: it writes the bundle (the Dockerfile
// and our agent), uploads it to S3 with the SDK's transfer manager, asks for the build
// (CreateMicrovmImage, or UpdateMicrovmImage for a new version of an existing image) and reads
// the version's state until the build ends. A failed build is a *BuildFailedError naming the
// service's reasons.
func Push(ctx context.Context, o PushOptions) (*PushResult, error) {
	progress := o.Progress
	if progress == nil {
		progress = func(string) {}
	}
	ref, err := BaseRef(spec.Image{Ref: o.Ref})
	if err != nil {
		return nil, err
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	bundle, err := Bundle(ref, o.Agent)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(bundle)
	digest := hex.EncodeToString(sum[:])
	if o.Key == "" {
		n := o.Name
		if n == "" {
			n = o.Image[strings.LastIndex(o.Image, ":")+1:]
		}
		o.Key = "airlock/images/" + n + "/" + digest[:32] + ".zip"
	}
	if o.Credentials == nil {
		ac, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(o.Region))
		if err != nil {
			return nil, fmt.Errorf("%w: aws credentials chain: %v", sandbox.ErrUnauthenticated, err)
		}
		o.Credentials = ac.Credentials
	}
	uri := "s3://" + o.Bucket + "/" + o.Key
	progress(fmt.Sprintf("bundle: Dockerfile FROM %s and airlock-agent (%d bytes, sha256 %s)", ref, len(bundle), digest[:16]))
	if err := upload(ctx, o, bundle, progress); err != nil {
		return nil, err
	}
	progress("uploaded " + uri)

	api, err := NewClient(o.Region, o.Endpoint, o.Credentials, o.HTTPClient)
	if err != nil {
		return nil, err
	}
	tok, err := newClientToken()
	if err != nil {
		return nil, err
	}
	memory := o.MemoryMiB
	if memory == 0 {
		memory = DefaultImageMemoryMiB
	}
	in := ImageBuildInput{
		Description:              "airlock: " + ref,
		BaseImageArn:             or(o.BaseImage, ManagedBaseImage(o.Region)),
		BaseImageVersion:         o.BaseImageVersion,
		BuildRoleArn:             o.BuildRole,
		CodeArtifact:             CodeArtifact{URI: uri},
		Logging:                  &ImageLogging{Disabled: &struct{}{}},
		EgressNetworkConnectors:  []string{or(o.BuildConnector, InternetEgressConnector(o.Region))},
		CPUConfigurations:        []CPUConfiguration{{Architecture: Arch}},
		Resources:                []ImageResources{{MinimumMemoryInMiB: memory}},
		AdditionalOsCapabilities: []string{},
		Hooks: &ImageHooks{Port: HooksPort,
			MicrovmImageHooks: &BuildHooks{Ready: "ENABLED", ReadyTimeoutInSeconds: 120},
			MicrovmHooks:      &MicrovmHooks{Run: "ENABLED", RunTimeoutInSeconds: 30, Resume: "ENABLED", ResumeTimeoutInSeconds: 30}},
		// One token per push: a create retried after a lost answer returns the first build.
		ClientToken: tok,
	}
	if o.LogGroup != "" {
		in.Logging = &ImageLogging{CloudWatch: &CloudWatch{LogGroup: o.LogGroup}}
	}
	var a *ImageAnswer
	if o.Name != "" {
		// No tags: tagging on create is authorized separately, and the description names the ref.
		a, err = api.CreateImage(ctx, CreateImageRequest{Name: o.Name, ImageBuildInput: in})
	} else {
		a, err = api.UpdateImage(ctx, o.Image, in)
	}
	if err != nil {
		return nil, err
	}
	if CheckImageArn(a.ImageArn) != nil || !versionRE().MatchString(a.ImageVersion) {
		return nil, fmt.Errorf("%w: the service answered image %q version %q", sandbox.ErrOutcomeUnknown, a.ImageArn, a.ImageVersion)
	}
	progress(fmt.Sprintf("image %s version %s: %s", a.ImageArn, a.ImageVersion, a.State))
	if o.LogGroup != "" {
		progress("build logs: CloudWatch log group " + o.LogGroup)
	}
	v, err := waitBuild(ctx, api, a.ImageArn, a.ImageVersion, o.PollInterval, progress)
	if err != nil {
		return nil, err
	}
	return &PushResult{Image: a.ImageArn, ImageVersion: a.ImageVersion, ImageRef: ref, Region: o.Region, CodeArtifact: uri,
		BundleBytes: len(bundle), BundleSHA256: digest, State: v.State, Status: v.Status, LogGroup: o.LogGroup}, nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// waitBuild reads the version until its build ends: SUCCESSFUL and ACTIVE, or FAILED with the
// service's reasons. Throttles and 5xx the client's retries did not outlast are reported and
// read again until ctx ends: the build goes on regardless of one unanswered read.
func waitBuild(ctx context.Context, api *Client, arn, version string, every time.Duration, progress func(string)) (*ImageVersion, error) {
	if every <= 0 {
		every = 5 * time.Second
	}
	last, start := "", time.Now()
	for {
		v, err := api.GetImageVersion(ctx, arn, version)
		var ae *APIError
		switch {
		case err != nil && errors.As(err, &ae) && ae.Retryable() && ctx.Err() == nil:
			progress(fmt.Sprintf("reading the build's state: %v (reading again)", err))
		case err != nil:
			return nil, fmt.Errorf("image %s version %s: %w", arn, version, err)
		default:
			if v.State != last {
				line := fmt.Sprintf("build %s (%s)", v.State, time.Since(start).Round(time.Second))
				if v.StateReason != "" {
					line += ": " + v.StateReason
				}
				progress(line)
				last = v.State
			}
			switch v.State {
			case VersionSuccessful:
				if v.Status != "" && v.Status != VersionActive {
					return nil, fmt.Errorf("%w: image %s version %s built, but its status is %s: RunMicrovm starts only ACTIVE versions", sandbox.ErrRefused, arn, version, v.Status)
				}
				return v, nil
			case VersionFailed:
				fe := &BuildFailedError{Image: arn, Version: version, Reason: v.StateReason}
				if builds, err := api.ListImageBuilds(ctx, arn, version); err == nil {
					fe.Builds = builds
				} else {
					progress(fmt.Sprintf("listing the failed builds: %v", err))
				}
				return nil, fe
			case VersionPending, VersionInProgress:
			default:
				return nil, fmt.Errorf("%w: image %s version %s is %s, not a build state", sandbox.ErrOutcomeUnknown, arn, version, v.State)
			}
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: image %s version %s is still %s: %v (the build goes on; read it with GetMicrovmImageVersion)", sandbox.ErrDeadlineExceeded, arn, version, last, ctx.Err())
		case <-t.C:
		}
	}
}

// uploadProgress reports an upload's bytes at each quarter; parts report from their own
// goroutines.
type uploadProgress struct {
	report  func(string)
	mu      sync.Mutex
	quarter int64
}

func (u *uploadProgress) OnObjectBytesTransferred(_ context.Context, e *transfermanager.ObjectBytesTransferredEvent) {
	if e.TotalBytes <= 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if q := e.BytesTransferred * 4 / e.TotalBytes; q > u.quarter {
		u.quarter = q
		u.report(fmt.Sprintf("uploading: %d of %d bytes", e.BytesTransferred, e.TotalBytes))
	}
}

// upload puts the bundle at o.Bucket/o.Key with the transfer manager (multipart when it is
// large), signed with o.Credentials for service s3.
func upload(ctx context.Context, o PushOptions, bundle []byte, progress func(string)) error {
	so := s3.Options{Region: o.Region, Credentials: o.Credentials}
	if o.HTTPClient != nil {
		so.HTTPClient = o.HTTPClient
	}
	if o.S3Endpoint != "" {
		so.BaseEndpoint = awssdk.String(o.S3Endpoint)
		so.UsePathStyle = true
	}
	tm := transfermanager.New(s3.New(so), func(t *transfermanager.Options) {
		t.PartSizeBytes, t.MultipartUploadThreshold = o.PartSize, o.MultipartThreshold
		t.ObjectProgressListeners.Register(&uploadProgress{report: progress})
	})
	_, err := tm.UploadObject(ctx, &transfermanager.UploadObjectInput{Bucket: awssdk.String(o.Bucket), Key: awssdk.String(o.Key),
		Body: bytes.NewReader(bundle), ContentType: awssdk.String("application/zip")})
	if err == nil {
		return nil
	}
	where := "upload s3://" + o.Bucket + "/" + o.Key
	var ae smithy.APIError
	var re *awshttp.ResponseError
	status := 0
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	switch {
	case errors.As(err, &ae) && ae.ErrorCode() == "NoSuchBucket":
		return fmt.Errorf("%w: %s: bucket %s does not exist (in %s): %v", sandbox.ErrNotFound, where, o.Bucket, o.Region, err)
	case status == http.StatusForbidden || errors.As(err, &ae) && ae.ErrorCode() == "AccessDenied":
		return fmt.Errorf("%w: %s: s3:PutObject is denied: %v", sandbox.ErrForbidden, where, err)
	case status == http.StatusBadRequest:
		return fmt.Errorf("%w: %s: %v", sandbox.ErrInvalid, where, err)
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s: %v", sandbox.ErrDeadlineExceeded, where, err)
	}
	return fmt.Errorf("%w: %s: %v", sandbox.ErrUnreachable, where, err)
}
