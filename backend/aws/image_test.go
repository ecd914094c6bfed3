package aws_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/aws/fake"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// elfBinary is a minimal 64-bit little-endian ELF executable for machine, with a PT_INTERP
// program header when dynamic, followed by pad: enough for debug/elf, on any host.
func elfBinary(machine elf.Machine, dynamic bool, pad []byte) []byte {
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT), 0})
	b.Write(make([]byte, 8))
	phnum := uint16(1)
	binary.Write(&b, le, uint16(elf.ET_EXEC))
	binary.Write(&b, le, uint16(machine))
	binary.Write(&b, le, uint32(elf.EV_CURRENT))
	binary.Write(&b, le, uint64(0x400000)) // entry
	binary.Write(&b, le, uint64(64))       // phoff
	binary.Write(&b, le, uint64(0))        // shoff
	binary.Write(&b, le, uint32(0))        // flags
	binary.Write(&b, le, uint16(64))       // ehsize
	binary.Write(&b, le, uint16(56))       // phentsize
	binary.Write(&b, le, phnum)
	binary.Write(&b, le, uint16(64)) // shentsize
	binary.Write(&b, le, uint16(0))  // shnum
	binary.Write(&b, le, uint16(0))  // shstrndx
	typ := elf.PT_LOAD
	if dynamic {
		typ = elf.PT_INTERP
	}
	binary.Write(&b, le, uint32(typ))
	binary.Write(&b, le, uint32(elf.PF_R|elf.PF_X))
	for range 6 {
		binary.Write(&b, le, uint64(0))
	}
	b.Write(pad)
	return b.Bytes()
}

var arm64Agent = elfBinary(elf.EM_AARCH64, false, []byte("airlock-agent"))

// TestBundle: the zip holds the Dockerfile for the reference and the agent, executable; an
// agent that cannot run in a MicroVM is refused, naming why.
func TestBundle(t *testing.T) {
	const ref = "docker.io/library/python:3.12-slim"
	z, err := awsb.Bundle(ref, arm64Agent)
	if err != nil {
		t.Fatal(err)
	}
	files, err := awsb.ReadBundle(z, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Errorf("bundle has %d entries, want Dockerfile and airlock-agent", len(files))
	}
	df := string(files["Dockerfile"].Data)
	for _, want := range []string{
		"\nFROM " + ref + "\n",
		"\nCOPY airlock-agent /usr/local/bin/airlock-agent\n",
		"\nUSER root\n",
		"\nEXPOSE 8080 8971\n",
		"\nENTRYPOINT [\"/usr/local/bin/airlock-agent\", \"lambda\"]\n",
		// The base image's CMD would be appended to the agent's arguments.
		"\nCMD []\n",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q:\n%s", want, df)
		}
	}
	if got := awsb.DockerfileFrom(df); got != ref {
		t.Errorf("DockerfileFrom = %q", got)
	}
	ag := files["airlock-agent"]
	if !bytes.Equal(ag.Data, arm64Agent) {
		t.Error("the bundle's agent is not the agent given")
	}
	if ag.Mode.Perm() != 0o755 || !ag.Mode.IsRegular() {
		t.Errorf("agent mode %v, want -rwxr-xr-x", ag.Mode)
	}
	if files["Dockerfile"].Mode.Perm() != 0o644 {
		t.Errorf("Dockerfile mode %v", files["Dockerfile"].Mode)
	}
	again, _ := awsb.Bundle(ref, arm64Agent)
	if !bytes.Equal(z, again) {
		t.Error("the same inputs make different bundles (the object key is content-addressed)")
	}

	for _, tc := range []struct {
		name  string
		agent []byte
		class error
		want  string
	}{
		{"not ELF", []byte("#!/bin/sh\nexec true\n"), sandbox.ErrInvalid, "not an ELF executable"},
		{"amd64", elfBinary(elf.EM_X86_64, false, nil), sandbox.ErrUnsupported, "built for amd64 (x86-64), and a MicroVM is ARM_64"},
		{"dynamic", elfBinary(elf.EM_AARCH64, true, nil), sandbox.ErrInvalid, "dynamically linked"},
		{"riscv", elfBinary(elf.EM_RISCV, false, nil), sandbox.ErrUnsupported, "the only architecture Lambda MicroVMs offer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := awsb.Bundle(ref, tc.agent)
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "GOARCH=arm64") {
				t.Errorf("Bundle: %v; want %v naming %q and how to build the agent", err, tc.class, tc.want)
			}
		})
	}
}

// TestBaseRef: only a registry reference can be a FROM; every other image kind is refused,
// naming it.
func TestBaseRef(t *testing.T) {
	for _, tc := range []struct {
		img   spec.Image
		class error
		want  string
	}{
		{spec.Image{Ref: "python:3.12"}, nil, ""},
		{spec.Image{Ref: "ghcr.io/o/i@sha256:" + strings.Repeat("a", 64)}, nil, ""},
		{spec.Image{Host: true}, sandbox.ErrUnsupported, "a host image is on this machine only"},
		{spec.Image{Dir: "/srv/root"}, sandbox.ErrUnsupported, "a dir image"},
		{spec.Image{OCILayout: "/srv/layout"}, sandbox.ErrUnsupported, "a ociLayout image"},
		{spec.Image{Tarball: "/srv/i.tar"}, sandbox.ErrUnsupported, "a tarball image"},
		{spec.Image{Snapshot: "snap"}, sandbox.ErrUnsupported, "a snapshot image"},
		{spec.Image{}, sandbox.ErrInvalid, "exactly one image source"},
		{spec.Image{Ref: "Python:3"}, sandbox.ErrInvalid, "not a registry reference"},
		{spec.Image{Ref: "python:3 AS x"}, sandbox.ErrInvalid, "not a registry reference"},
		{spec.Image{Ref: "reg.example/$IMG:1"}, sandbox.ErrInvalid, "not a registry reference"},
	} {
		got, err := awsb.BaseRef(tc.img)
		if tc.class == nil {
			if err != nil || got != tc.img.Ref {
				t.Errorf("BaseRef(%s) = %q, %v", tc.img, got, err)
			}
			continue
		}
		if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("BaseRef(%s): %v; want %v naming %q", tc.img, err, tc.class, tc.want)
		}
	}
}

const (
	pushBucket = "airlock-images"
	pushRole   = "arn:aws:iam::123456789012:role/airlock-microvm-build"
	pushRef    = "registry.example/airlock/python:3"
)

// pushWorld is a fake with a bucket and no guests (nothing here runs a MicroVM).
func pushWorld(t *testing.T) *fake.Server {
	f := fake.New(testRegion, func(context.Context, fake.RunInfo) (fake.Guest, error) {
		return nil, errors.New("no guests in this test")
	})
	f.Buckets = []string{pushBucket}
	f.BuildSteps = 3
	t.Cleanup(f.Close)
	return f
}

// progressLog collects Push's progress lines.
type progressLog struct {
	mu    sync.Mutex
	lines []string
}

func (p *progressLog) add(s string) { p.mu.Lock(); p.lines = append(p.lines, s); p.mu.Unlock() }
func (p *progressLog) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func pushOptions(f *fake.Server, log *progressLog) awsb.PushOptions {
	return awsb.PushOptions{Region: testRegion, Endpoint: f.URL(), S3Endpoint: f.S3URL(), Credentials: fake.Credentials(),
		Ref: pushRef, Agent: arm64Agent, Name: "airlock-python", Bucket: pushBucket, BuildRole: pushRole,
		PollInterval: 1, Progress: log.add}
}

// TestPushFake: a push uploads the bundle, builds the image through its states, and answers
// what the aws config section takes; a second push of the same image is its next version.
func TestPushFake(t *testing.T) {
	f := pushWorld(t)
	var log progressLog
	res, err := awsb.Push(t.Context(), pushOptions(f, &log))
	if err != nil {
		t.Fatalf("Push: %v\n%s", err, log.String())
	}
	wantArn := "arn:aws:lambda:" + testRegion + ":123456789012:microvm-image:airlock-python"
	if res.Image != wantArn || res.ImageVersion != "1.0" || res.ImageRef != pushRef || res.State != awsb.VersionSuccessful || res.Status != awsb.VersionActive {
		t.Errorf("result %+v", res)
	}
	key := strings.TrimPrefix(res.CodeArtifact, "s3://"+pushBucket+"/")
	obj, ok := f.Object(pushBucket, key)
	if !ok || len(obj) != res.BundleBytes {
		t.Fatalf("object %s: %v, %d bytes; objects %v", res.CodeArtifact, ok, len(obj), f.Objects())
	}
	files, err := awsb.ReadBundle(obj, 1<<20)
	if err != nil || awsb.DockerfileFrom(string(files["Dockerfile"].Data)) != pushRef {
		t.Errorf("uploaded bundle: %v, %v", files, err)
	}
	out := log.String()
	i, j, k := strings.Index(out, "build PENDING"), strings.Index(out, "build IN_PROGRESS"), strings.Index(out, "build SUCCESSFUL")
	if i < 0 || j < i || k < j {
		t.Errorf("progress does not show the build's states in order:\n%s", out)
	}
	if f.BuiltFrom(res.Image) != pushRef {
		t.Errorf("the fake's image was built from %q", f.BuiltFrom(res.Image))
	}
	api := apiClient(t, f, testRegion, fake.Credentials())
	imageIs := func(state, active, failed string) {
		t.Helper()
		m, err := api.GetImage(t.Context(), res.Image)
		if err != nil || m.State != state || m.LatestActiveImageVersion != active || m.LatestFailedImageVersion != failed {
			t.Errorf("GetMicrovmImage: %+v, %v; want %s, active %q, failed %q", m, err, state, active, failed)
		}
	}
	imageIs(awsb.ImageCreated, "1.0", "")

	o := pushOptions(f, &log)
	o.Name, o.Image = "", res.Image
	res2, err := awsb.Push(t.Context(), o)
	if err != nil || res2.Image != res.Image || res2.ImageVersion != "2.0" {
		t.Errorf("second push: %+v, %v", res2, err)
	}
	imageIs(awsb.ImageUpdated, "2.0", "")
	f.FailBuild("no")
	if _, err := awsb.Push(t.Context(), o); err == nil {
		t.Error("a failed build pushed")
	}
	imageIs(awsb.ImageUpdateFailed, "2.0", "3.0")
	// A MicroVM runs an ACTIVE version only.
	for v, ok := range map[string]bool{"": true, "1.0": true, "2.0": true, "3.0": false} {
		_, err := api.Run(t.Context(), awsb.RunRequest{ImageIdentifier: res.Image, ImageVersion: v, MaximumDurationInSeconds: 60,
			RunHookPayload: `{"sandboxId":"s","sessionId":"microvm","keyRing":"k"}`})
		if ok != (err == nil || !errors.Is(err, sandbox.ErrInvalid)) {
			t.Errorf("run of version %q: %v", v, err)
		}
	}
	// The same inputs are the same object.
	if res2.CodeArtifact != res.CodeArtifact {
		t.Errorf("same bundle, keys %s and %s", res.CodeArtifact, res2.CodeArtifact)
	}
	// A new image of the same name is the service's refusal.
	if _, err := awsb.Push(t.Context(), pushOptions(f, &log)); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("create of an existing name: %v", err)
	}
}

// TestPushMultipart: a bundle over the threshold goes up in parts and arrives whole.
func TestPushMultipart(t *testing.T) {
	f := pushWorld(t)
	pad := make([]byte, 12<<20)
	rand.Read(pad)
	var log progressLog
	o := pushOptions(f, &log)
	o.Agent = elfBinary(elf.EM_AARCH64, false, pad)
	o.PartSize, o.MultipartThreshold = 5<<20, 5<<20
	res, err := awsb.Push(t.Context(), o)
	if err != nil {
		t.Fatalf("Push: %v\n%s", err, log.String())
	}
	if n := f.Calls("UploadPart"); n != 3 || f.Calls("PutObject") != 0 || f.Calls("CompleteMultipartUpload") != 1 {
		t.Errorf("UploadPart %d, PutObject %d, Complete %d; want 3 parts", n, f.Calls("PutObject"), f.Calls("CompleteMultipartUpload"))
	}
	if !strings.Contains(log.String(), fmt.Sprintf("uploading: %d of %d bytes", res.BundleBytes, res.BundleBytes)) {
		t.Errorf("progress does not show the upload's end:\n%s", log.String())
	}
	obj, _ := f.Object(pushBucket, strings.TrimPrefix(res.CodeArtifact, "s3://"+pushBucket+"/"))
	files, err := awsb.ReadBundle(obj, 64<<20)
	if err != nil || !bytes.Equal(files["airlock-agent"].Data, o.Agent) {
		t.Errorf("the assembled object is not the bundle: %v", err)
	}
}

// TestPushFaults: throttles and 5xx during the upload and the build are retried through; what
// outlasts the retries, a build the service fails and a refused request are errors of their
// class naming the reason; a failed upload asks for no build.
func TestPushFaults(t *testing.T) {
	slow := fake.Fault{Status: 503, Type: "SlowDown", Message: "Please reduce your request rate."}
	s3err := fake.Fault{Status: 500, Type: "InternalError", Message: "We encountered an internal error. Please try again."}
	throttle := fake.Fault{Status: 429, Type: awsb.TypeThrottling, Message: "Rate exceeded"}
	internal := fake.Fault{Status: 500, Type: awsb.TypeInternal, Message: "internal"}
	for _, tc := range []struct {
		name   string
		setup  func(f *fake.Server, o *awsb.PushOptions)
		class  error  // nil: the push succeeds
		want   string // in the error
		images int    // images the fake holds after
		asked  bool   // a failed push got as far as asking for the build
		check  func(t *testing.T, f *fake.Server, log string)
	}{
		{name: "upload throttled twice", setup: func(f *fake.Server, o *awsb.PushOptions) { f.Inject("PutObject", slow, slow) },
			check: func(t *testing.T, f *fake.Server, _ string) {
				if n := f.Calls("PutObject"); n != 3 {
					t.Errorf("PutObject calls %d, want 3", n)
				}
			}},
		{name: "upload 5xx outlasts the retries", setup: func(f *fake.Server, o *awsb.PushOptions) { f.Inject("PutObject", s3err, s3err, s3err, s3err) },
			class: sandbox.ErrUnreachable, want: "InternalError"},
		{name: "part 5xx retried", setup: func(f *fake.Server, o *awsb.PushOptions) {
			pad := make([]byte, 11<<20)
			rand.Read(pad)
			o.Agent = elfBinary(elf.EM_AARCH64, false, pad)
			o.PartSize, o.MultipartThreshold = 5<<20, 5<<20
			f.Inject("UploadPart", s3err)
		}},
		{name: "no such bucket", setup: func(f *fake.Server, o *awsb.PushOptions) { o.Bucket = "other-bucket" },
			class: sandbox.ErrNotFound, want: "bucket other-bucket does not exist"},
		{name: "wrong credentials", setup: func(f *fake.Server, o *awsb.PushOptions) {
			o.Credentials = static("AKIDOTHER", fake.SecretKey)
		}, class: sandbox.ErrForbidden, want: "InvalidAccessKeyId"},
		{name: "wrong secret", setup: func(f *fake.Server, o *awsb.PushOptions) {
			o.Credentials = static(fake.AccessKey, "wrong")
		}, class: sandbox.ErrForbidden, want: "SignatureDoesNotMatch"},
		{name: "create throttled", setup: func(f *fake.Server, o *awsb.PushOptions) { f.Inject("CreateMicrovmImage", throttle, throttle) }},
		{name: "create answer lost", setup: func(f *fake.Server, o *awsb.PushOptions) {
			lost := internal
			lost.AfterWork = true
			f.Inject("CreateMicrovmImage", lost)
		}, check: func(t *testing.T, f *fake.Server, _ string) {
			if n := f.Calls("CreateMicrovmImage"); n != 2 {
				t.Errorf("CreateMicrovmImage calls %d, want 2 (the retry carries the same client token)", n)
			}
		}},
		{name: "create quota", setup: func(f *fake.Server, o *awsb.PushOptions) {
			f.Inject("CreateMicrovmImage", fake.Fault{Status: 402, Type: awsb.TypeQuotaExceeded, Message: "image quota reached"})
		}, class: sandbox.ErrRefused, want: "image quota reached", asked: true},
		{name: "reads throttled past the client's retries", setup: func(f *fake.Server, o *awsb.PushOptions) {
			f.Inject("GetMicrovmImageVersion", throttle, throttle, throttle, throttle, throttle, internal, internal)
		}, check: func(t *testing.T, f *fake.Server, log string) {
			if !strings.Contains(log, "(reading again)") {
				t.Errorf("progress does not say the read was retried:\n%s", log)
			}
		}},
		{name: "build fails", setup: func(f *fake.Server, o *awsb.PushOptions) {
			f.FailBuild("Step 2/6 : COPY airlock-agent: no space left on device")
		}, class: sandbox.ErrRefused, want: "build FAILED: One or more builds failed; build ", images: 1,
			check: func(t *testing.T, f *fake.Server, log string) {
				if !strings.Contains(log, "build FAILED") {
					t.Errorf("progress does not show FAILED:\n%s", log)
				}
			}},
		{name: "image in another region", setup: func(f *fake.Server, o *awsb.PushOptions) {
			o.Name, o.Image = "", "arn:aws:lambda:us-east-1:123456789012:microvm-image:x"
		}, class: sandbox.ErrInvalid, want: "is in region us-east-1"},
		{name: "signed for another region", setup: func(f *fake.Server, o *awsb.PushOptions) { o.Region = "us-east-1" },
			class: sandbox.ErrInvalid, want: "AuthorizationHeaderMalformed"},
		{name: "no role", setup: func(f *fake.Server, o *awsb.PushOptions) { o.BuildRole = "" }, class: sandbox.ErrInvalid, want: "buildRole"},
		{name: "role name past 512", setup: func(f *fake.Server, o *awsb.PushOptions) {
			o.BuildRole = "arn:aws:iam::123456789012:role/" + strings.Repeat("r", 513)
		}, class: sandbox.ErrInvalid, want: "buildRole"},
		{name: "role not a role", setup: func(f *fake.Server, o *awsb.PushOptions) {
			o.BuildRole = "arn:aws:iam::123456789012:user/builder"
		}, class: sandbox.ErrInvalid, want: "buildRole"},
		{name: "bad bucket", setup: func(f *fake.Server, o *awsb.PushOptions) { o.Bucket = "Images_1" }, class: sandbox.ErrInvalid, want: "bucket \"Images_1\""},
		{name: "bad name", setup: func(f *fake.Server, o *awsb.PushOptions) { o.Name = "my image" }, class: sandbox.ErrInvalid, want: "[a-zA-Z0-9-_]"},
		{name: "name and image", setup: func(f *fake.Server, o *awsb.PushOptions) {
			o.Image = "arn:aws:lambda:eu-north-1:123456789012:microvm-image:x"
		}, class: sandbox.ErrInvalid, want: "not both or neither"},
		{name: "not a tier", setup: func(f *fake.Server, o *awsb.PushOptions) { o.MemoryMiB = 3000 }, class: sandbox.ErrInvalid, want: "memory tier"},
		{name: "amd64 agent", setup: func(f *fake.Server, o *awsb.PushOptions) { o.Agent = elfBinary(elf.EM_X86_64, false, nil) },
			class: sandbox.ErrUnsupported, want: "ARM_64"},
		{name: "local image", setup: func(f *fake.Server, o *awsb.PushOptions) { o.Ref = "./root" },
			class: sandbox.ErrInvalid, want: "reads as a dir image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := pushWorld(t)
			var log progressLog
			o := pushOptions(f, &log)
			tc.setup(f, &o)
			res, err := awsb.Push(t.Context(), o)
			switch {
			case tc.class == nil && err != nil:
				t.Fatalf("Push: %v\n%s", err, log.String())
			case tc.class == nil && (res.State != awsb.VersionSuccessful || res.ImageVersion != "1.0"):
				t.Errorf("result %+v", res)
			case tc.class != nil && (!errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Push: %v; want %v naming %q", err, tc.class, tc.want)
			}
			if tc.class != nil && !tc.asked && tc.images == 0 && f.Calls("CreateMicrovmImage") != 0 {
				t.Errorf("a failed push asked for %d builds", f.Calls("CreateMicrovmImage"))
			}
			want := tc.images
			if tc.class == nil {
				want = 1
			}
			if n := f.ImageNames(); len(n) != want {
				t.Errorf("images the fake holds: %v, want %d", n, want)
			}
			if len(f.Images) != boolInt(tc.class == nil) {
				t.Errorf("images the fake can run: %v", f.Images)
			}
			if tc.check != nil {
				tc.check(t, f, log.String())
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestBuildFailedReasons: the error carries the version's and each build's reason.
func TestBuildFailedReasons(t *testing.T) {
	f := pushWorld(t)
	f.FailBuild("pull docker.io/library/nope:1: manifest unknown")
	var log progressLog
	_, err := awsb.Push(t.Context(), pushOptions(f, &log))
	var fe *awsb.BuildFailedError
	if !errors.As(err, &fe) {
		t.Fatalf("Push: %v, want a *BuildFailedError", err)
	}
	if len(fe.Builds) != 2 || fe.Version != "1.0" || !strings.Contains(err.Error(), "(ARM_64 GRAVITON4): pull docker.io/library/nope:1: manifest unknown") {
		t.Errorf("error %q, builds %+v", err, fe.Builds)
	}
}

// zipOf is a zip of name → (mode, data).
func zipOf(t *testing.T, files map[string]awsb.BundleFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for n, f := range files {
		h := &zip.FileHeader{Name: n, Method: zip.Deflate}
		h.SetMode(f.Mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(f.Data)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestFakeBuildReadsBundle: the fake's build ends as the bundle decides (what the ready hook
// would prove), with a reason naming what is wrong.
func TestFakeBuildReadsBundle(t *testing.T) {
	f := pushWorld(t)
	f.BuildSteps = 0
	api := apiClient(t, f, testRegion, fake.Credentials())
	s3c := s3.New(s3.Options{Region: testRegion, Credentials: fake.Credentials(), BaseEndpoint: awssdk.String(f.S3URL()), UsePathStyle: true})
	df := awsb.BundleFile{Mode: 0o644, Data: []byte(awsb.Dockerfile(pushRef))}
	ag := awsb.BundleFile{Mode: 0o755, Data: arm64Agent}
	for i, tc := range []struct {
		name   string
		files  map[string]awsb.BundleFile
		reason string // "" builds
	}{
		{"good", map[string]awsb.BundleFile{"Dockerfile": df, "airlock-agent": ag}, ""},
		{"no Dockerfile", map[string]awsb.BundleFile{"airlock-agent": ag}, "no Dockerfile at its root"},
		{"no FROM", map[string]awsb.BundleFile{"Dockerfile": {Mode: 0o644, Data: []byte("COPY airlock-agent /x\n")}, "airlock-agent": ag}, "no FROM"},
		{"COPY source missing", map[string]awsb.BundleFile{"Dockerfile": df}, "COPY airlock-agent: not in the build context"},
		{"agent not executable", map[string]awsb.BundleFile{"Dockerfile": df, "airlock-agent": {Mode: 0o644, Data: arm64Agent}}, "permission denied"},
		{"amd64 agent", map[string]awsb.BundleFile{"Dockerfile": df, "airlock-agent": {Mode: 0o755, Data: elfBinary(elf.EM_X86_64, false, nil)}}, "exec format error"},
		{"another entrypoint", map[string]awsb.BundleFile{"Dockerfile": {Mode: 0o644, Data: []byte("FROM python:3\nENTRYPOINT [\"python3\"]\n")}}, "the entrypoint is not /usr/local/bin/airlock-agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("b/%d.zip", i)
			if _, err := s3c.PutObject(t.Context(), &s3.PutObjectInput{Bucket: awssdk.String(pushBucket), Key: awssdk.String(key), Body: bytes.NewReader(zipOf(t, tc.files))}); err != nil {
				t.Fatal(err)
			}
			a, err := api.CreateImage(t.Context(), awsb.CreateImageRequest{Name: fmt.Sprintf("img-%d", i), ImageBuildInput: awsb.ImageBuildInput{
				BaseImageArn: awsb.ManagedBaseImage(testRegion), BuildRoleArn: pushRole, CodeArtifact: awsb.CodeArtifact{URI: "s3://" + pushBucket + "/" + key}}})
			if err != nil {
				t.Fatal(err)
			}
			v, err := api.GetImageVersion(t.Context(), a.ImageArn, a.ImageVersion)
			if err != nil {
				t.Fatal(err)
			}
			builds, err := api.ListImageBuilds(t.Context(), a.ImageArn, a.ImageVersion)
			if err != nil || len(builds) != 2 {
				t.Fatalf("builds %v, %v", builds, err)
			}
			if tc.reason == "" {
				if v.State != awsb.VersionSuccessful || v.Status != awsb.VersionActive {
					t.Errorf("version %+v", v)
				}
				return
			}
			if v.State != awsb.VersionFailed || !strings.Contains(builds[0].StateReason, tc.reason) {
				t.Errorf("version %+v, build %+v; want FAILED naming %q", v, builds[0], tc.reason)
			}
		})
	}
	// An image never built is not one RunMicrovm takes.
	if _, err := api.Run(t.Context(), awsb.RunRequest{ImageIdentifier: "arn:aws:lambda:" + testRegion + ":123456789012:microvm-image:img-1"}); !errors.Is(err, sandbox.ErrNotFound) && !awsb.IsNotFound(err) {
		t.Errorf("run of a failed image: %v", err)
	}
}

// TestFakeS3Signature: the fake's S3 takes a request only when it is signed for s3 in its
// region and its x-amz-content-sha256 is the body's hash, as S3 does.
func TestFakeS3Signature(t *testing.T) {
	f := pushWorld(t)
	hash := func(b string) string { s := sha256.Sum256([]byte(b)); return hex.EncodeToString(s[:]) }
	for _, tc := range []struct {
		name            string
		header, signed  string // x-amz-content-sha256 sent, and the hash signed
		service, region string
		status          int
		code            string
	}{
		{"good", hash("abc"), hash("abc"), "s3", testRegion, 200, ""},
		{"hash of another body", hash("abd"), hash("abd"), "s3", testRegion, 400, "XAmzContentSHA256Mismatch"},
		{"signed over another hash", hash("abc"), hash("abd"), "s3", testRegion, 403, "SignatureDoesNotMatch"},
		{"unsigned payload", "UNSIGNED-PAYLOAD", "UNSIGNED-PAYLOAD", "s3", testRegion, 501, "NotImplemented"},
		{"no hash", "", hash("abc"), "s3", testRegion, 400, "InvalidRequest"},
		{"signed for lambda", hash("abc"), hash("abc"), "lambda", testRegion, 403, "InvalidSignatureException"},
		{"signed for another region", hash("abc"), hash("abc"), "s3", "us-east-1", 400, "AuthorizationHeaderMalformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := strings.ReplaceAll(tc.name, " ", "-")
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, f.S3URL()+"/"+pushBucket+"/"+key, strings.NewReader("abc"))
			if tc.header != "" {
				req.Header.Set("X-Amz-Content-Sha256", tc.header)
			}
			creds, _ := fake.Credentials().Retrieve(t.Context())
			signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
			if err := signer.SignHTTP(t.Context(), creds, req, tc.signed, tc.service, tc.region, time.Now().UTC()); err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(body), "<Code>"+tc.code+"</Code>") && tc.code != "" {
				t.Errorf("HTTP %d %s; want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
			if _, stored := f.Object(pushBucket, key); stored != (tc.status == 200) {
				t.Errorf("object stored: %v", stored)
			}
		})
	}
}
