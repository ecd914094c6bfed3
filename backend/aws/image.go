package aws

import (
	"archive/zip"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// The MicroVM image API's wire shapes (CreateMicrovmImage, UpdateMicrovmImage,
// GetMicrovmImage, GetMicrovmImageVersion, ListMicrovmImageBuilds), as recorded from the live
// service by others (notes/cloud-apis.md §1.4; what no recording shows is in docs/platforms/aws.md).

// Image states (the named image) and version states (one build lineage).
const (
	ImageCreating     = "CREATING"
	ImageCreated      = "CREATED"
	ImageCreateFailed = "CREATE_FAILED"
	ImageUpdating     = "UPDATING"
	ImageUpdated      = "UPDATED"
	ImageUpdateFailed = "UPDATE_FAILED"

	VersionPending    = "PENDING"
	VersionInProgress = "IN_PROGRESS"
	VersionSuccessful = "SUCCESSFUL"
	VersionFailed     = "FAILED"

	// VersionActive is the only version status RunMicrovm starts from.
	VersionActive = "ACTIVE"
)

// Fixed values of the images airlock builds.
const (
	// Arch is the only CPU architecture MicroVMs offer (cpuConfigurations' one member).
	Arch = "ARM_64"
	// HooksPort is where `airlock-agent lambda` answers the lifecycle hooks.
	HooksPort = 8080
	// DefaultImageMemoryMiB is the baseline tier undeclared sizes get (2 GiB, bursting to 8).
	DefaultImageMemoryMiB = 2048
	// BundleAgentPath and BundleDockerfile are the zip's entries; GuestAgentPath is where the
	// Dockerfile puts the agent in the image.
	BundleAgentPath  = "airlock-agent"
	BundleDockerfile = "Dockerfile"
	GuestAgentPath   = "/usr/local/bin/airlock-agent"
)

// ManagedBaseImage is the Lambda-managed base image of a region the build layers on.
func ManagedBaseImage(region string) string {
	return "arn:aws:lambda:" + region + ":aws:microvm-image:al2023-1"
}

// InternetEgressConnector is the AWS-managed connector a build reaches registries through (a
// deny connector there means the image never builds).
func InternetEgressConnector(region string) string {
	return "arn:aws:lambda:" + region + ":aws:network-connector:aws-network-connector:INTERNET_EGRESS"
}

// CodeArtifact is the S3 zip an image is built from.
type CodeArtifact struct {
	URI string `json:"uri"`
}

// CPUConfiguration is one architecture an image is built for.
type CPUConfiguration struct {
	Architecture string `json:"architecture"`
}

// ImageResources is an image's memory tier (the baseline; a MicroVM bursts to four times it).
type ImageResources struct {
	MinimumMemoryInMiB int `json:"minimumMemoryInMiB"`
}

// BuildHooks are the hooks called while the image is built.
type BuildHooks struct {
	Ready                 string `json:"ready"`
	ReadyTimeoutInSeconds int    `json:"readyTimeoutInSeconds"`
}

// MicrovmHooks are the hooks called for each MicroVM.
type MicrovmHooks struct {
	Run                    string `json:"run"`
	RunTimeoutInSeconds    int    `json:"runTimeoutInSeconds"`
	Resume                 string `json:"resume"`
	ResumeTimeoutInSeconds int    `json:"resumeTimeoutInSeconds"`
}

// ImageHooks says where the guest answers its lifecycle hooks and which are on.
type ImageHooks struct {
	Port              int           `json:"port"`
	MicrovmImageHooks *BuildHooks   `json:"microvmImageHooks,omitempty"`
	MicrovmHooks      *MicrovmHooks `json:"microvmHooks,omitempty"`
}

// ImageLogging is a union, like RunMicrovm's: CloudWatch (where build and guest logs go) or
// disabled.
type ImageLogging struct {
	CloudWatch *CloudWatch `json:"cloudWatch,omitempty"`
	Disabled   *struct{}   `json:"disabled,omitempty"`
}

// ImageBuildInput is what CreateMicrovmImage and UpdateMicrovmImage share: every build input
// (an update is a PUT: what it leaves out is dropped from the new version).
type ImageBuildInput struct {
	Description              string             `json:"description,omitempty"`
	BaseImageArn             string             `json:"baseImageArn"`
	BaseImageVersion         string             `json:"baseImageVersion,omitempty"`
	BuildRoleArn             string             `json:"buildRoleArn"`
	CodeArtifact             CodeArtifact       `json:"codeArtifact"`
	Logging                  *ImageLogging      `json:"logging,omitempty"`
	EgressNetworkConnectors  []string           `json:"egressNetworkConnectors,omitempty"`
	CPUConfigurations        []CPUConfiguration `json:"cpuConfigurations,omitempty"`
	Resources                []ImageResources   `json:"resources,omitempty"`
	AdditionalOsCapabilities []string           `json:"additionalOsCapabilities"`
	Hooks                    *ImageHooks        `json:"hooks,omitempty"`
	EnvironmentVariables     map[string]string  `json:"environmentVariables,omitempty"`
	ClientToken              string             `json:"clientToken,omitempty"`
}

// CreateImageRequest is CreateMicrovmImage's body.
type CreateImageRequest struct {
	Name string `json:"name"`
	ImageBuildInput
	Tags map[string]string `json:"tags,omitempty"`
}

// UpdateImageRequest is UpdateMicrovmImage's body (the image is named by the path).
type UpdateImageRequest = ImageBuildInput

// ImageAnswer is what CreateMicrovmImage and UpdateMicrovmImage answer: ImageVersion is the
// version this call minted (the one to poll), LatestActiveImageVersion the one MicroVMs run now.
type ImageAnswer struct {
	ImageArn                 string `json:"imageArn"`
	Name                     string `json:"name,omitempty"`
	State                    string `json:"state"`
	ImageVersion             string `json:"imageVersion"`
	LatestActiveImageVersion string `json:"latestActiveImageVersion,omitempty"`
}

// MicrovmImage is GetMicrovmImage's answer.
type MicrovmImage struct {
	ImageArn                 string `json:"imageArn"`
	Name                     string `json:"name,omitempty"`
	State                    string `json:"state"`
	LatestActiveImageVersion string `json:"latestActiveImageVersion,omitempty"`
	LatestFailedImageVersion string `json:"latestFailedImageVersion,omitempty"`
}

// ImageVersion is GetMicrovmImageVersion's answer: State is the build's progress, Status
// whether MicroVMs may run it, StateReason the service's own words.
type ImageVersion struct {
	ImageArn     string       `json:"imageArn"`
	ImageVersion string       `json:"imageVersion"`
	State        string       `json:"state"`
	Status       string       `json:"status,omitempty"`
	StateReason  string       `json:"stateReason,omitempty"`
	CodeArtifact CodeArtifact `json:"codeArtifact"`
}

// ImageBuild is one build attempt of a version (one per chipset generation).
type ImageBuild struct {
	BuildID               string `json:"buildId"`
	BuildState            string `json:"buildState"`
	Architecture          string `json:"architecture,omitempty"`
	Chipset               string `json:"chipset,omitempty"`
	ChipsetGeneration     string `json:"chipsetGeneration,omitempty"`
	StateReason           string `json:"stateReason,omitempty"`
	TerminationReasonCode string `json:"terminationReasonCode,omitempty"`
}

// ImageBuildList is a page of ListMicrovmImageBuilds.
type ImageBuildList struct {
	Items     []ImageBuild `json:"items"`
	NextToken *string      `json:"nextToken,omitempty"`
}

// Compiled on first use, not at start: every binary linking this package starts (the full
// CLI on every cold airlock run and pool refill) and most never check an AWS name. The
// role's path and name, at most 512 bytes, are counted by roleArn, not by the pattern
// ({1,512} compiles to 512 copies of the class: 0.7 ms and 4,000 allocations).
var (
	imageNameRE = lazyRE(`^[a-zA-Z0-9_-]{1,64}$`)
	imageArnRE  = lazyRE(`^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:microvm-image:[a-zA-Z0-9_-]{1,64}$`)
	roleArnRE   = lazyRE(`^arn:aws[a-z-]*:iam::\d{12}:role/([\w+=,.@/-]+)$`)
	bucketRE    = lazyRE(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
	versionRE   = lazyRE(`^[0-9A-Za-z.]{1,32}$`)
)

func lazyRE(pattern string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
}

// roleArn reports whether s is an IAM role's ARN.
func roleArn(s string) bool {
	m := roleArnRE().FindStringSubmatch(s)
	return m != nil && len(m[1]) <= 512
}

// CheckImageName refuses what CreateMicrovmImage refuses as a name.
func CheckImageName(n string) error {
	if !imageNameRE().MatchString(n) {
		return fmt.Errorf("%w: image name %q: a MicroVM image's name is 1 to 64 of [a-zA-Z0-9-_]", sandbox.ErrInvalid, n)
	}
	return nil
}

// CheckImageArn refuses what is not a MicroVM image's ARN.
func CheckImageArn(arn string) error {
	if !imageArnRE().MatchString(arn) {
		return fmt.Errorf("%w: image %q is not a MicroVM image's ARN (arn:aws:lambda:<region>:<account>:microvm-image:<name>)", sandbox.ErrInvalid, arn)
	}
	return nil
}

// ImageRegion is the region an image ARN names.
func ImageRegion(arn string) string {
	parts := strings.Split(arn, ":")
	if len(parts) < 4 {
		return ""
	}
	return parts[3]
}

// BaseRef is the registry reference a declared image gives a Dockerfile's FROM, or why there
// is none: the service builds only from a Dockerfile in a zip, and a FROM names an image in a
// registry, so a host root, a local directory, layout, tarball or snapshot cannot be built.
func BaseRef(img spec.Image) (string, error) {
	switch k := img.Kind(); k {
	case spec.ImageRef:
	case "":
		return "", fmt.Errorf("%w: image %q: declare exactly one image source (image.ref for aws)", sandbox.ErrInvalid, img.String())
	default:
		return "", fmt.Errorf("%w: image %s: Lambda builds a MicroVM image from a Dockerfile whose FROM names an image in a registry; a %s image is on this machine only: push it to a registry and declare image.ref",
			sandbox.ErrUnsupported, img.String(), k)
	}
	if again, _ := spec.ImageFromString(img.Ref); again.Kind() != spec.ImageRef {
		return "", fmt.Errorf("%w: image.ref %q is not a registry reference a Dockerfile's FROM takes: it reads as a %s image", sandbox.ErrInvalid, img.Ref, again.Kind())
	}
	if _, err := name.ParseReference(img.Ref); err != nil {
		return "", fmt.Errorf("%w: image.ref %q is not a registry reference a Dockerfile's FROM takes: %v", sandbox.ErrInvalid, img.Ref, err)
	}
	if strings.ContainsAny(img.Ref, " \t\r\n\\$") {
		return "", fmt.Errorf("%w: image.ref %q: a FROM line takes no spaces, backslashes or variables", sandbox.ErrInvalid, img.Ref)
	}
	return img.Ref, nil
}

// CheckAgent refuses an agent binary that cannot run in a MicroVM: not an ELF executable, not
// built for arm64 (MicroVMs offer ARM_64 only), or dynamically linked (it runs in any image,
// whatever its libc).
func CheckAgent(bin []byte) error {
	const build = "build it with CGO_ENABLED=0 GOOS=linux GOARCH=arm64 go build -o airlock-agent ./cmd/airlock-agent"
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("%w: agent binary is not an ELF executable (%v): %s", sandbox.ErrInvalid, err, build)
	}
	defer f.Close()
	if f.Machine != elf.EM_AARCH64 || f.Class != elf.ELFCLASS64 {
		return fmt.Errorf("%w: agent binary is built for %s, and a MicroVM is %s (arm64), the only architecture Lambda MicroVMs offer: %s",
			sandbox.ErrUnsupported, machineName(f.Machine), Arch, build)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%w: agent binary is an ELF %s, not an executable: %s", sandbox.ErrInvalid, f.Type, build)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: agent binary is dynamically linked; it runs inside images whose libc nobody knows: %s", sandbox.ErrInvalid, build)
		}
	}
	return nil
}

func machineName(m elf.Machine) string {
	switch m {
	case elf.EM_X86_64:
		return "amd64 (x86-64)"
	case elf.EM_386:
		return "386"
	case elf.EM_ARM:
		return "32-bit arm"
	case elf.EM_AARCH64:
		return "arm64 (32-bit class)"
	}
	return m.String()
}

// Dockerfile is the build recipe of an image for ref: the declared image, our agent as the
// guest service answering Lambda's hooks, as root (it drops to uid 60000 for code), with no
// command of the base image's left to be appended to the agent's arguments.
func Dockerfile(ref string) string {
	return "# Written by airlock image push: " + ref + " with airlock's agent as the MicroVM's guest service.\n" +
		"FROM " + ref + "\n" +
		"COPY " + BundleAgentPath + " " + GuestAgentPath + "\n" +
		"USER root\n" +
		"EXPOSE " + strconv.Itoa(HooksPort) + " " + strconv.Itoa(AgentPort) + "\n" +
		`ENTRYPOINT ["` + GuestAgentPath + `", "lambda"]` + "\n" +
		"CMD []\n"
}

// bundleTime is every zip entry's time, so the same inputs make the same bytes (and key).
var bundleTime = time.Date(2025, 9, 9, 0, 0, 0, 0, time.UTC)

// Bundle is the zip CreateMicrovmImage builds from: the Dockerfile for ref at its root and the
// agent beside it, executable (COPY keeps a build context file's mode; a RUN chmod would need
// a shell the base image may not have).
func Bundle(ref string, agentBin []byte) ([]byte, error) {
	if err := CheckAgent(agentBin); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range []struct {
		name string
		mode os.FileMode
		data []byte
	}{{BundleDockerfile, 0o644, []byte(Dockerfile(ref))}, {BundleAgentPath, 0o755, agentBin}} {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate, Modified: bundleTime}
		h.SetMode(e.mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BundleFile is one entry of a bundle as ReadBundle finds it.
type BundleFile struct {
	Mode os.FileMode
	Data []byte
}

// ReadBundle reads a bundle's entries (the fake's build, and tests); at most max bytes each.
func ReadBundle(zipBytes []byte, max int64) (map[string]BundleFile, error) {
	zr, err := zip.NewReader(bytes.NewReader(zipBytes), int64(len(zipBytes)))
	if err != nil {
		return nil, err
	}
	out := map[string]BundleFile{}
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(io.LimitReader(rc, max+1))
		rc.Close()
		if err != nil {
			return nil, err
		}
		if int64(len(b)) > max {
			return nil, fmt.Errorf("%s is over %d bytes", f.Name, max)
		}
		out[f.Name] = BundleFile{Mode: f.Mode(), Data: b}
	}
	return out, nil
}

// DockerfileFrom is the first FROM's image of a Dockerfile ("" when it has none).
func DockerfileFrom(df string) string {
	for _, line := range strings.Split(df, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			for _, a := range f[1:] {
				if !strings.HasPrefix(a, "--") {
					return a
				}
			}
		}
	}
	return ""
}
