package fake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
)

// The fake's MicroVM images: CreateMicrovmImage and UpdateMicrovmImage read the bundle from
// the fake's S3 and decide the build's outcome from it (a Dockerfile at the root with a FROM,
// its COPY sources present, an arm64 static agent that is executable: what the ready hook
// would prove); the version then walks PENDING → IN_PROGRESS → SUCCESSFUL or FAILED over
// BuildSteps reads. A built image is one RunMicrovm accepts, and its guests start from the
// bundle's FROM (RunInfo.BuiltFrom). Wording the live service was not recorded saying is the
// fake's own.

type image struct {
	arn, name    string
	state        string
	created      time.Time
	versions     []*version
	active       string // latest SUCCESSFUL version
	failed       string // latest FAILED version
	settledState string // CREATED or UPDATED once the newest version succeeds
}

type version struct {
	v         string
	codeURI   string
	from      string
	stepsLeft int
	steps     int
	outcome   string // SUCCESSFUL or FAILED, shown once stepsLeft reaches 0
	reason    string
	state     string
	builds    []awsb.ImageBuild
}

// imageCall is a remembered answer to a client token.
type imageCall struct {
	status int
	answer awsb.ImageAnswer
}

var coreFieldRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// FailBuild makes the next builds fail with these reasons, whatever their bundles.
func (s *Server) FailBuild(reasons ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buildFaults = append(s.buildFaults, reasons...)
}

// runVersionLocked is the version RunMicrovm starts for an image and a requested version ("":
// the latest active): for an image the fake built, a version whose build succeeded (the fake's
// own wording for one that did not); for an image it was given, "1.0".
func (s *Server) runVersionLocked(arn, want string) (string, *Fault) {
	img := s.images[s.imageName(arn)]
	if img == nil {
		return or(want, "1.0"), nil
	}
	if want == "" {
		return img.active, nil
	}
	for _, v := range img.versions {
		if v.v == want && v.state == awsb.VersionSuccessful {
			return want, nil
		}
	}
	return "", bad("image %s version %s is not an ACTIVE version", arn, want)
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ImageNames lists the images the fake holds.
func (s *Server) ImageNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.images {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// BuiltFrom is the FROM reference of the latest successful version of an image ("" when none).
func (s *Server) BuiltFrom(arn string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.builtFromLocked(arn)
}

func (s *Server) builtFromLocked(arn string) string {
	img := s.images[s.imageName(arn)]
	if img == nil || img.active == "" {
		return ""
	}
	for _, v := range img.versions {
		if v.v == img.active {
			return v.from
		}
	}
	return ""
}

func (s *Server) imageArn(name string) string {
	return "arn:aws:lambda:" + s.Region + ":" + s.Account + ":microvm-image:" + name
}

// imageName is the name an identifier (ARN or name) names.
func (s *Server) imageName(id string) string {
	if i := strings.LastIndex(id, ":microvm-image:"); i >= 0 && strings.HasPrefix(id, "arn:") {
		return id[i+len(":microvm-image:"):]
	}
	return id
}

func imageNotFound(id string) *Fault {
	b, _ := json.Marshal(map[string]any{"message": "MicroVMImage not found for MicroVMImageID: " + id, "resourceId": nil, "resourceType": nil})
	return &Fault{Status: 404, Type: awsb.TypeNotFound, Body: string(b)}
}

// checkBuildInput is the model's constraints on a create's or update's body.
func checkBuildInput(in awsb.ImageBuildInput, raw map[string]json.RawMessage) *Fault {
	var missing []string
	for _, k := range []string{"baseImageArn", "codeArtifact", "buildRoleArn"} {
		if v, ok := raw[k]; !ok || string(v) == "null" {
			missing = append(missing, fmt.Sprintf("Value null at '%s' failed to satisfy constraint: Member must not be null", k))
		}
	}
	if len(missing) > 0 {
		return bad("%d validation errors detected: %s", len(missing), strings.Join(missing, "; "))
	}
	if !strings.HasPrefix(in.BaseImageArn, "arn:") || !strings.HasPrefix(in.BuildRoleArn, "arn:") {
		return bad("baseImageArn and buildRoleArn must be ARNs")
	}
	if !strings.HasPrefix(in.CodeArtifact.URI, "s3://") {
		return bad("codeArtifact.uri %q: an s3:// URI", in.CodeArtifact.URI)
	}
	for _, c := range in.CPUConfigurations {
		if c.Architecture != awsb.Arch {
			return bad("Value '%s' at 'cpuConfigurations.member.architecture' failed to satisfy constraint: Member must satisfy enum value set: [ARM_64]", c.Architecture)
		}
	}
	for _, r := range in.Resources {
		switch r.MinimumMemoryInMiB {
		case 512, 1024, 2048, 4096, 8192:
		default:
			return bad("resources.minimumMemoryInMiB %d is not a memory tier", r.MinimumMemoryInMiB)
		}
	}
	if h := in.Hooks; h != nil {
		if h.Port < 1 || h.Port > 65535 {
			return bad("hooks.port %d: 1 to 65535", h.Port)
		}
		if h.MicrovmHooks != nil && (h.MicrovmImageHooks == nil || h.MicrovmImageHooks.Ready != "ENABLED") {
			return bad("hooks: the ready hook is required when any MicroVM hook is enabled")
		}
	}
	for _, c := range in.AdditionalOsCapabilities {
		if c != "ALL" {
			return bad("additionalOsCapabilities: %q is not ALL", c)
		}
	}
	if in.Logging != nil && (in.Logging.CloudWatch == nil) == (in.Logging.Disabled == nil) {
		return bad("logging: exactly one of cloudWatch, disabled")
	}
	if len(in.ClientToken) > 128 {
		return bad("clientToken: at most 128 characters")
	}
	return nil
}

// decideBuild reads the bundle as the build would and says how it ends, and the FROM.
func (s *Server) decideBuild(uri string) (outcome, reason, from string) {
	if len(s.buildFaults) > 0 {
		reason = s.buildFaults[0]
		s.buildFaults = s.buildFaults[1:]
		return awsb.VersionFailed, reason, ""
	}
	bucketKey := strings.TrimPrefix(uri, "s3://")
	zipBytes, ok := s.objects[bucketKey]
	if !ok {
		return awsb.VersionFailed, "Unable to read code artifact " + uri + ": the object does not exist or the build role may not read it", ""
	}
	files, err := awsb.ReadBundle(zipBytes, maxObject)
	if err != nil {
		return awsb.VersionFailed, "Code artifact " + uri + " is not a readable zip: " + err.Error(), ""
	}
	df, ok := files["Dockerfile"]
	if !ok {
		return awsb.VersionFailed, "Code artifact has no Dockerfile at its root", ""
	}
	from = awsb.DockerfileFrom(string(df.Data))
	if from == "" {
		return awsb.VersionFailed, "Dockerfile has no FROM instruction", ""
	}
	entry := ""
	for _, line := range strings.Split(string(df.Data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && strings.EqualFold(f[0], "COPY") {
			for _, src := range f[1 : len(f)-1] {
				if strings.HasPrefix(src, "--") {
					continue
				}
				if _, ok := files[src]; !ok {
					return awsb.VersionFailed, "Dockerfile: COPY " + src + ": not in the build context", from
				}
			}
		}
		if len(f) >= 2 && strings.EqualFold(f[0], "ENTRYPOINT") {
			var argv []string
			if json.Unmarshal([]byte(strings.TrimSpace(line[len(f[0]):])), &argv) == nil && len(argv) > 0 {
				entry = argv[0]
			}
		}
	}
	// The ready hook answers only if the entrypoint runs: in the fake, that is our agent,
	// copied from the context, executable, and built for the MicroVM.
	if entry != awsb.GuestAgentPath {
		return awsb.VersionFailed, "ready hook did not answer: the entrypoint is not " + awsb.GuestAgentPath, from
	}
	agentFile, ok := files[awsb.BundleAgentPath]
	if !ok {
		return awsb.VersionFailed, "ready hook did not answer: no agent in the build context", from
	}
	if agentFile.Mode.Perm()&0o111 == 0 {
		return awsb.VersionFailed, "ready hook did not answer: exec " + awsb.GuestAgentPath + ": permission denied", from
	}
	if err := awsb.CheckAgent(agentFile.Data); err != nil {
		return awsb.VersionFailed, "ready hook did not answer: exec " + awsb.GuestAgentPath + ": exec format error", from
	}
	return awsb.VersionSuccessful, "", from
}

// newVersion mints a version of img and decides its build.
func (s *Server) newVersion(img *image, uri string) *version {
	n := len(img.versions) + 1
	outcome, reason, from := s.decideBuild(uri)
	v := &version{v: strconv.Itoa(n) + ".0", codeURI: uri, from: from, stepsLeft: s.BuildSteps, steps: s.BuildSteps,
		outcome: outcome, reason: reason, state: awsb.VersionPending}
	for _, gen := range []string{"4", "3"} {
		v.builds = append(v.builds, awsb.ImageBuild{BuildID: randHex(16), BuildState: awsb.VersionPending, Architecture: awsb.Arch, Chipset: "GRAVITON", ChipsetGeneration: gen})
	}
	if v.stepsLeft <= 0 {
		s.settle(img, v)
	}
	img.versions = append(img.versions, v)
	return v
}

// settle ends v's build with its outcome.
func (s *Server) settle(img *image, v *version) {
	v.state = v.outcome
	for i := range v.builds {
		v.builds[i].BuildState = v.outcome
		if v.outcome == awsb.VersionFailed {
			v.builds[i].StateReason = v.reason
		}
	}
	if v.outcome == awsb.VersionSuccessful {
		img.active = v.v
		img.state = img.settledState
		if !slices.Contains(s.Images, img.arn) {
			s.Images = append(s.Images, img.arn)
		}
		return
	}
	img.failed = v.v
	if img.settledState == awsb.ImageCreated {
		img.state = awsb.ImageCreateFailed
	} else {
		img.state = awsb.ImageUpdateFailed
	}
}

// decodeBody decodes a request body into req, refusing unknown fields as the service does, and
// returns its members as given (which ones were sent at all, null or not).
func decodeBody(body []byte, req any) (map[string]json.RawMessage, *Fault) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, bad("body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return nil, bad("body: %v", err)
	}
	return raw, nil
}

func (s *Server) createImage(body []byte) (int, any, *Fault) {
	var req awsb.CreateImageRequest
	raw, f := decodeBody(body, &req)
	if f != nil {
		return 0, nil, f
	}
	if _, ok := raw["name"]; !ok {
		return 0, nil, bad("1 validation error detected: Value null at 'name' failed to satisfy constraint: Member must not be null")
	}
	if !coreFieldRE.MatchString(req.Name) || len(req.Name) > 64 {
		return 0, nil, bad("1 validation error detected: Value '%s' at 'name' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9-_]+", req.Name)
	}
	if f := checkBuildInput(req.ImageBuildInput, raw); f != nil {
		return 0, nil, f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.imageTokens[req.ClientToken]; ok && req.ClientToken != "" {
		return c.status, c.answer, nil
	}
	if _, ok := s.images[req.Name]; ok {
		return 0, nil, bad("MicroVM image already exists: %s", req.Name)
	}
	img := &image{arn: s.imageArn(req.Name), name: req.Name, state: awsb.ImageCreating, created: time.Now(), settledState: awsb.ImageCreated}
	s.images[req.Name] = img
	v := s.newVersion(img, req.CodeArtifact.URI)
	a := awsb.ImageAnswer{ImageArn: img.arn, Name: img.name, State: awsb.ImageCreating, ImageVersion: v.v}
	if req.ClientToken != "" {
		s.imageTokens[req.ClientToken] = imageCall{status: http.StatusCreated, answer: a}
	}
	return http.StatusCreated, a, nil
}

func (s *Server) updateImage(id string, body []byte) (int, any, *Fault) {
	var req awsb.UpdateImageRequest
	raw, f := decodeBody(body, &req)
	if f != nil {
		return 0, nil, f
	}
	if f := checkBuildInput(req, raw); f != nil {
		return 0, nil, f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.imageTokens[req.ClientToken]; ok && req.ClientToken != "" {
		return c.status, c.answer, nil
	}
	img := s.images[s.imageName(id)]
	if img == nil {
		return 0, nil, imageNotFound(id)
	}
	if img.state == awsb.ImageCreating || img.state == awsb.ImageUpdating {
		f := errf(409, awsb.TypeConflict, "MicroVM image %s is %s", img.name, img.state)
		return 0, nil, &f
	}
	img.state, img.settledState = awsb.ImageUpdating, awsb.ImageUpdated
	v := s.newVersion(img, req.CodeArtifact.URI)
	a := awsb.ImageAnswer{ImageArn: img.arn, Name: img.name, State: awsb.ImageUpdating, ImageVersion: v.v, LatestActiveImageVersion: img.active}
	if req.ClientToken != "" {
		s.imageTokens[req.ClientToken] = imageCall{status: http.StatusOK, answer: a}
	}
	return http.StatusOK, a, nil
}

func (s *Server) getImage(id string) (any, *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img := s.images[s.imageName(id)]
	if img == nil {
		return nil, imageNotFound(id)
	}
	return awsb.MicrovmImage{ImageArn: img.arn, Name: img.name, State: img.state, LatestActiveImageVersion: img.active, LatestFailedImageVersion: img.failed}, nil
}

// getVersion is GetMicrovmImageVersion; each read of a building version moves it a step.
func (s *Server) getVersion(id, ver string) (any, *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img := s.images[s.imageName(id)]
	if img == nil {
		return nil, imageNotFound(id)
	}
	for _, v := range img.versions {
		if v.v != ver {
			continue
		}
		if v.stepsLeft > 0 {
			if v.stepsLeft < v.steps {
				v.state = awsb.VersionInProgress
				for i := range v.builds {
					v.builds[i].BuildState = awsb.VersionInProgress
				}
			}
			v.stepsLeft--
			if v.stepsLeft == 0 {
				defer func() { s.settle(img, v) }()
			}
		}
		out := awsb.ImageVersion{ImageArn: img.arn, ImageVersion: v.v, State: v.state, Status: awsb.VersionActive, CodeArtifact: awsb.CodeArtifact{URI: v.codeURI}}
		if v.state == awsb.VersionFailed {
			out.Status, out.StateReason = "INACTIVE", "One or more builds failed"
		}
		return out, nil
	}
	b, _ := json.Marshal(map[string]any{"message": "MicroVMImage not found for MicroVMImage: " + id + ", Version: " + ver, "resourceId": nil, "resourceType": nil})
	return nil, &Fault{Status: 404, Type: awsb.TypeNotFound, Body: string(b)}
}

func (s *Server) listBuilds(id, ver string) (any, *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img := s.images[s.imageName(id)]
	if img == nil {
		return nil, imageNotFound(id)
	}
	for _, v := range img.versions {
		if v.v == ver {
			return awsb.ImageBuildList{Items: slices.Clone(v.builds)}, nil
		}
	}
	return nil, imageNotFound(id)
}
