// Package azure is the azure platform: sandboxes in an Azure Container Apps sandbox group, driven through its data plane.
package azure

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Defaults of the wire (../shared/notes/cloud-apis.md §2; §6 lists what is disputed).
const (
	// DefaultAPIVersion is the data plane's and the ARM sandboxGroups' api-version as
	// Microsoft's own docs use it (alien used 2025-02-02-preview for ARM).
	DefaultAPIVersion = "2026-02-01-preview"
	// DefaultDataPlaneScope is the data plane's token scope as the aca CLI, the Terraform
	// provider and third-party clients use it (alien used https://management.azuredevcompute.io/.default).
	DefaultDataPlaneScope = "https://dynamicsessions.io/.default"
	// DefaultARMEndpoint is Azure Resource Manager.
	DefaultARMEndpoint = "https://management.azure.com"
	// armScope is ARM's token scope, whatever endpoint ARM is reached at.
	armScope = "https://management.azure.com/.default"
)

// Labels the backend puts on every sandbox it creates. A declaration may not use the prefix.
const (
	labelManaged = "airlock-managed"
	labelSandbox = "airlock-sandbox"
	labelWorkdir = "airlock-workdir" // base64url of the workdir: label values take no '/'
	labelPrefix  = plan.AzureLabelPrefix
)

// States of a sandbox on the data plane.
const (
	stateRunning = "Running"
	stateFailed  = "Failed"
)

// Options say where the sandbox group is and how to reach it.
type Options struct {
	SubscriptionID string
	ResourceGroup  string
	// SandboxGroup is the Microsoft.App/sandboxGroups resource the sandboxes live in.
	SandboxGroup string
	// Region places the data plane at https://management.{region}.azuredevcompute.io.
	Region string
	// CreateGroup makes the sandbox group (in Region) when it does not exist; otherwise a
	// missing group is an error naming it.
	CreateGroup bool
	// DataPlaneEndpoint and ARMEndpoint override the data plane's and ARM's base URLs
	// (https://host[:port]); tests point them at the fake.
	DataPlaneEndpoint string
	ARMEndpoint       string
	// DataPlaneScope is the data plane token's scope (default DefaultDataPlaneScope).
	DataPlaneScope string
	// APIVersion is the data plane's and ARM's api-version (default DefaultAPIVersion).
	APIVersion string
	// Credential signs requests (default azidentity.DefaultAzureCredential).
	Credential azcore.TokenCredential
	// HTTPClient sends the requests (default azcore's).
	HTTPClient *http.Client
	// PollInterval caps the interval of create's and terminate's polls (default 2 s).
	PollInterval time.Duration
	// RetryDelay is the first retry's delay of a throttled or failed call when the answer
	// has no Retry-After (default azcore's 800 ms).
	RetryDelay time.Duration
	Logger     *slog.Logger
}

// Backend runs sandboxes in one sandbox group.
type Backend struct {
	opts     Options
	log      *slog.Logger
	data     *wire
	arm      *wire
	caps     capability.Set
	groupURL string // the group's ARM path
}

var (
	_ sandbox.Backend      = (*Backend)(nil)
	_ sandbox.EgressSetter = (*Backend)(nil)
)

// New checks the options and builds the clients; it does not reach Azure (the first call does).
func New(ctx context.Context, opts Options) (*Backend, error) {
	bad := func(field, value, msg string) error {
		return fmt.Errorf("%w: azure %s %q: %s", sandbox.ErrInvalid, field, value, msg)
	}
	for _, f := range []struct{ name, v string }{
		{"subscription", opts.SubscriptionID}, {"resourceGroup", opts.ResourceGroup}, {"sandboxGroup", opts.SandboxGroup},
	} {
		if f.v == "" {
			return nil, fmt.Errorf("%w: azure %s is not set (config file key azure.%s)", sandbox.ErrInvalid, f.name, f.name)
		}
		if strings.ContainsAny(f.v, "/?#% ") {
			return nil, bad(f.name, f.v, "may not contain '/', '?', '#', '%' or spaces")
		}
	}
	if opts.DataPlaneEndpoint == "" {
		if opts.Region == "" {
			return nil, fmt.Errorf("%w: azure region is not set (config file key azure.region): the data plane is https://management.{region}.azuredevcompute.io", sandbox.ErrInvalid)
		}
		if !isRegion(opts.Region) {
			return nil, bad("region", opts.Region, "must be an Azure region name such as westus2 (lower-case letters and digits)")
		}
		opts.DataPlaneEndpoint = "https://management." + opts.Region + ".azuredevcompute.io"
	}
	if opts.ARMEndpoint == "" {
		opts.ARMEndpoint = DefaultARMEndpoint
	}
	for _, e := range []struct{ name, v string }{{"dataPlaneEndpoint", opts.DataPlaneEndpoint}, {"armEndpoint", opts.ARMEndpoint}} {
		u, err := url.Parse(e.v)
		if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, bad(e.name, e.v, "must be https://host[:port] (tokens are sent only over TLS)")
		}
	}
	if opts.DataPlaneScope == "" {
		opts.DataPlaneScope = DefaultDataPlaneScope
	}
	if opts.APIVersion == "" {
		opts.APIVersion = DefaultAPIVersion
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Credential == nil {
		cred, err := azidentity.NewDefaultAzureCredential(nil)
		if err != nil {
			return nil, fmt.Errorf("%w: azure credential: %v", sandbox.ErrUnauthenticated, err)
		}
		opts.Credential = cred
	}
	b := &Backend{opts: opts, log: opts.Logger.With("backend", "azure"), caps: Published()}
	b.data = b.newWire(strings.TrimSuffix(opts.DataPlaneEndpoint, "/")+
		"/subscriptions/"+opts.SubscriptionID+"/resourceGroups/"+opts.ResourceGroup+"/sandboxGroups/"+opts.SandboxGroup,
		opts.DataPlaneScope)
	b.arm = b.newWire(strings.TrimSuffix(opts.ARMEndpoint, "/"), armScope)
	b.groupURL = "/subscriptions/" + opts.SubscriptionID + "/resourceGroups/" + opts.ResourceGroup + "/providers/Microsoft.App/sandboxGroups/" + opts.SandboxGroup
	return b, nil
}

// Hand-written checks, not regexps: package init is on the CLI's start-up path.

// isRegion: an Azure region name, lower-case letters and digits, 2 to 40.
func isRegion(s string) bool {
	return len(s) >= 2 && len(s) <= 40 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789") == ""
}

// isSandboxID: what a sandbox id the service assigns looks like (a UUID), [A-Za-z0-9][A-Za-z0-9_-]{0,63};
// anything else is refused before it reaches a URL path.
func isSandboxID(s string) bool {
	return len(s) >= 1 && len(s) <= 64 && s[0] != '_' && s[0] != '-' &&
		strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == ""
}

func (b *Backend) newWire(base, scope string) *wire {
	co := &policy.ClientOptions{}
	if b.opts.HTTPClient != nil {
		co.Transport = b.opts.HTTPClient
	}
	co.Retry.RetryDelay = b.opts.RetryDelay
	co.Logging.IncludeBody = false
	pl := runtime.NewPipeline("airlock-azure", "v1", runtime.PipelineOptions{
		PerRetry: []policy.Policy{runtime.NewBearerTokenPolicy(b.opts.Credential, []string{scope}, nil)},
	}, co)
	return &wire{pl: pl, base: base, apiVersion: b.opts.APIVersion}
}

// Close releases nothing: sandboxes live on.
func (b *Backend) Close() error { return nil }

// Platform is azure.
func (b *Backend) Platform() capability.Platform { return capability.Azure }

// Capabilities is the published set: what this backend enforces does not depend on the host.
func (b *Backend) Capabilities(context.Context) capability.Set { return b.caps }

// Describe names the sandbox group, for messages.
func (b *Backend) Describe() string {
	return fmt.Sprintf("sandbox group %s in %s/%s (%s)", b.opts.SandboxGroup, b.opts.SubscriptionID, b.opts.ResourceGroup, b.opts.DataPlaneEndpoint)
}

// resolved is a declaration turned into the create body.
type resolved struct {
	body    createBody
	workdir string
}

func resolve(decl spec.Sandbox) (*resolved, error) {
	bad := func(field, value, msg string) error {
		return fmt.Errorf("%w: %s %q: %s", sandbox.ErrInvalid, field, value, msg)
	}
	if err := spec.ValidateID(decl.ID); err != nil {
		return nil, err
	}
	r := &resolved{}
	switch decl.Image.Kind() {
	case spec.ImageRef:
		// A sandbox starts from a disk image of the group: a public one (ubuntu, node-22, ...)
		// by name. Building a disk image from an OCI reference is not known on the wire.
		if !plan.AzureDiskImage(decl.Image.Ref) {
			return nil, bad("image", decl.Image.Ref, "azure starts a sandbox from a disk image named in the sandbox group (lower-case letters, digits, '-', '.' and '_', such as ubuntu or node-22); building one from an OCI reference is not supported")
		}
		r.body.SourcesRef.DiskImage = &diskImage{Name: decl.Image.Ref, IsPublic: true}
	default:
		return nil, fmt.Errorf("%w: image %s: azure starts sandboxes from disk images named by reference (capability %s)", sandbox.ErrUnsupported, decl.Image.Kind(), capability.ImageRef)
	}
	cpu, err := decl.Limits.CPUMillis()
	if err != nil {
		return nil, fmt.Errorf("%w: limits.cpu: %v", sandbox.ErrInvalid, err)
	}
	mem, err := decl.Limits.MemoryBytes()
	if err != nil {
		return nil, fmt.Errorf("%w: limits.memory: %v", sandbox.ErrInvalid, err)
	}
	switch {
	case cpu < 1 || cpu > capability.AzureMaxCPUMillis:
		return nil, bad("limits.cpu", string(decl.Limits.CPU), fmt.Sprintf("azure sizes reach from the XS tier to the L tier: 1m to %dm", capability.AzureMaxCPUMillis))
	case mem < minMemoryBytes || mem > capability.AzureMaxMemoryBytes:
		return nil, bad("limits.memory", string(decl.Limits.Memory), "azure sizes reach from the XS tier to the L tier: 64Mi to 4Gi")
	}
	// Free-form sizes within the tiers, so the ceiling is the declared one, not a larger tier's.
	r.body.Resources = resources{CPU: fmt.Sprintf("%dm", cpu), Memory: resource.NewQuantity(mem, resource.BinarySI).String()}
	switch decl.Egress.Mode {
	case "", spec.EgressDeny, spec.EgressAllowDomains, spec.EgressOpen:
		p, err := policyFor(decl.Egress)
		if err != nil {
			return nil, err
		}
		r.body.EgressPolicy = p
	case spec.EgressAllow:
		return nil, fmt.Errorf("%w: egress mode allow: azure's egress policy is not known to keep private and metadata addresses out (capability %s)", sandbox.ErrUnsupported, capability.PublicOnlyEgress)
	default:
		return nil, bad("egress.mode", string(decl.Egress.Mode), "must be deny, allow, allowDomains or open")
	}
	if len(decl.PreviewPorts) > 0 {
		return nil, fmt.Errorf("%w: previewPorts: the azure backend publishes no ports (capability %s)", sandbox.ErrUnsupported, capability.Preview)
	}
	r.workdir = decl.Workdir
	if r.workdir == "" {
		r.workdir = spec.DefaultWorkdir
	}
	if !path.IsAbs(r.workdir) || path.Clean(r.workdir) != r.workdir || r.workdir == "/" {
		return nil, bad("workdir", r.workdir, "must be an absolute, clean path other than /")
	}
	labels := map[string]string{labelManaged: "true", labelSandbox: decl.ID, labelWorkdir: base64.RawURLEncoding.EncodeToString([]byte(r.workdir))}
	for k, v := range decl.Labels {
		if strings.HasPrefix(k, labelPrefix) {
			return nil, bad("labels", k, "keys starting with "+labelPrefix+" are the azure backend's own")
		}
		labels[k] = v
	}
	r.body.Labels = labels
	if len(decl.Env) > 0 {
		r.body.Environment = decl.Env
	}
	return r, nil
}

// minMemoryBytes is a floor below which no interpreter starts; the XS tier is 512 MB.
const minMemoryBytes = 64 << 20

// policyFor is the egress policy of a mode other than allow.
func policyFor(e spec.Egress) (*egressPolicy, error) {
	switch e.Mode {
	case "", spec.EgressDeny:
		if len(e.Domains) > 0 {
			return nil, fmt.Errorf("%w: egress.domains %q: only valid with mode allowDomains", sandbox.ErrInvalid, strings.Join(e.Domains, ","))
		}
		return &egressPolicy{DefaultAction: "Deny"}, nil
	case spec.EgressAllowDomains:
		if len(e.Domains) == 0 {
			return nil, fmt.Errorf("%w: egress.domains: allowDomains needs at least one domain", sandbox.ErrInvalid)
		}
		p := &egressPolicy{DefaultAction: "Deny", TrafficInspection: "Full"}
		for _, d := range e.Domains {
			p.HostRules = append(p.HostRules, hostRule{Pattern: d, Action: "Allow"})
		}
		return p, nil
	case spec.EgressOpen:
		if len(e.Domains) > 0 {
			return nil, fmt.Errorf("%w: egress.domains %q: only valid with mode allowDomains", sandbox.ErrInvalid, strings.Join(e.Domains, ","))
		}
		return &egressPolicy{DefaultAction: "Allow"}, nil
	case spec.EgressAllow:
		return nil, fmt.Errorf("%w: egress mode allow: azure's egress policy is not known to keep private and metadata addresses out (capability %s)", sandbox.ErrUnsupported, capability.PublicOnlyEgress)
	}
	return nil, fmt.Errorf("%w: egress.mode %q: must be deny, allow, allowDomains or open", sandbox.ErrInvalid, e.Mode)
}

// Create makes a sandbox and returns once it runs and a command has run in it. What the set
// says no to is refused first (plan.CheckSandbox: ErrRefused naming the capability).
func (b *Backend) Create(ctx context.Context, decl spec.Sandbox) (*sandbox.Session, error) {
	if err := plan.CheckSandbox(decl, b.caps); err != nil {
		return nil, err
	}
	r, err := resolve(decl)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	if err := b.ensureGroup(ctx); err != nil {
		return nil, err
	}
	var sb sandboxJSON
	if err := b.data.call(policy.WithRetryOptions(ctx, noReplay), http.MethodPut, "/sandboxes", nil, r.body, &sb); err != nil {
		if errors.Is(err, sandbox.ErrUnreachable) && statusOf(err) == 0 || statusOf(err) >= 500 {
			// The service may have made one: it has our labels, but no id we know.
			return nil, fmt.Errorf("%w: create %s: %w (a sandbox may have been made: list the group's sandboxes labelled %s=%s)", sandbox.ErrOutcomeUnknown, decl.ID, err, labelSandbox, decl.ID)
		}
		return nil, fmt.Errorf("create %s: %w", decl.ID, err)
	}
	if !isSandboxID(sb.ID) {
		return nil, fmt.Errorf("%w: create %s: the data plane answered without a usable sandbox id (%q)", sandbox.ErrUnreachable, decl.ID, sb.ID)
	}
	sess, err := b.start(ctx, sb.ID, decl, r)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
		defer cancel()
		if derr := b.Terminate(cctx, sb.ID); derr != nil {
			return nil, fmt.Errorf("%w (and terminating sandbox %s failed: %v)", err, sb.ID, derr)
		}
		return nil, err
	}
	return sess, nil
}

// startTimeout bounds a create (and its clean-up) when ctx has no deadline: the SDK's own
// create poller gives up after 300 s.
const startTimeout = 5 * time.Minute

// start waits until the sandbox runs and makes its workdir.
func (b *Backend) start(ctx context.Context, id string, decl spec.Sandbox, r *resolved) (*sandbox.Session, error) {
	var last string
	for delay := 50 * time.Millisecond; ; {
		sb, err := b.get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("create %s: waiting for sandbox %s: %w", decl.ID, id, err)
		}
		last = sb.state()
		if last == stateRunning {
			break
		}
		if last == stateFailed {
			return nil, fmt.Errorf("%w: create %s: sandbox %s failed to start", sandbox.ErrUnreachable, decl.ID, id)
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, fmt.Errorf("%w: create %s: sandbox %s still %q: %v", sandbox.ErrDeadlineExceeded, decl.ID, id, last, err)
		}
		delay = min(delay*2, b.opts.PollInterval)
	}
	a := b.agent(id, decl.ID, r.workdir)
	if err := a.run(ctx, "mkdir -p -- "+quote(r.workdir), "/"); err != nil {
		return nil, fmt.Errorf("create %s: workdir %s: %w", decl.ID, r.workdir, err)
	}
	now := time.Now().UTC()
	b.log.Debug("sandbox created", "session", id, "sandbox", decl.ID)
	return &sandbox.Session{ID: id, SandboxID: decl.ID, Platform: string(capability.Azure), State: sandbox.StateRunning,
		Generation: 1, CreatedAt: now, Labels: decl.Labels, Spec: decl}, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// ensureGroup checks the sandbox group exists, making it when Options.CreateGroup says so.
func (b *Backend) ensureGroup(ctx context.Context) error {
	var g groupJSON
	err := b.arm.call(ctx, http.MethodGet, b.groupURL, nil, nil, &g)
	switch {
	case err == nil:
		return nil
	case statusOf(err) != http.StatusNotFound:
		return fmt.Errorf("sandbox group %s: %w", b.opts.SandboxGroup, err)
	case !b.opts.CreateGroup:
		return fmt.Errorf("%w: sandbox group %s does not exist in resource group %s (subscription %s): create it (docs/platforms/azure.md), or set azure.createGroup", sandbox.ErrNotFound, b.opts.SandboxGroup, b.opts.ResourceGroup, b.opts.SubscriptionID)
	case b.opts.Region == "":
		return fmt.Errorf("%w: sandbox group %s does not exist and azure.region, where it would be made, is not set", sandbox.ErrInvalid, b.opts.SandboxGroup)
	}
	if err := b.arm.call(ctx, http.MethodPut, b.groupURL, nil, groupJSON{Location: b.opts.Region}, &g); err != nil {
		return fmt.Errorf("create sandbox group %s: %w", b.opts.SandboxGroup, err)
	}
	for delay := 100 * time.Millisecond; ; {
		if err := b.arm.call(ctx, http.MethodGet, b.groupURL, nil, nil, &g); err != nil && statusOf(err) != http.StatusNotFound {
			return fmt.Errorf("create sandbox group %s: %w", b.opts.SandboxGroup, err)
		}
		if g.Properties != nil {
			switch g.Properties.ProvisioningState {
			case "Succeeded":
				return nil
			case "Failed", "Canceled":
				return fmt.Errorf("%w: create sandbox group %s: provisioning %s", sandbox.ErrUnreachable, b.opts.SandboxGroup, g.Properties.ProvisioningState)
			}
		}
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("%w: create sandbox group %s: %v", sandbox.ErrDeadlineExceeded, b.opts.SandboxGroup, err)
		}
		delay = min(delay*2, b.opts.PollInterval)
	}
}

func checkID(id string) error {
	if !isSandboxID(id) {
		return fmt.Errorf("%w: session id %q: an azure sandbox id is 1 to 64 letters, digits, '-' and '_'", sandbox.ErrInvalid, id)
	}
	return nil
}

func (b *Backend) get(ctx context.Context, id string) (*sandboxJSON, error) {
	var sb sandboxJSON
	if err := b.data.call(ctx, http.MethodGet, "/sandboxes/"+id, nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// session turns a sandbox this backend made into a session; ok is false for one it did not make.
func sessionFrom(sb *sandboxJSON) (*sandbox.Session, bool) {
	if sb.Labels[labelManaged] != "true" || sb.Labels[labelSandbox] == "" {
		return nil, false
	}
	s := &sandbox.Session{ID: sb.ID, SandboxID: sb.Labels[labelSandbox], Platform: string(capability.Azure), Generation: 1}
	switch sb.state() {
	case stateRunning, "Idle", "Creating":
		s.State = sandbox.StateRunning
	case "Suspended", "Stopped", "Stopping", "Resuming":
		s.State = sandbox.StatePaused
	default: // Deleting, Failed
		s.State = sandbox.StateTerminated
	}
	if t, err := time.Parse(time.RFC3339Nano, sb.CreatedAt); err == nil {
		s.CreatedAt = t
	}
	for k, v := range sb.Labels {
		if !strings.HasPrefix(k, labelPrefix) {
			if s.Labels == nil {
				s.Labels = map[string]string{}
			}
			s.Labels[k] = v
		}
	}
	// The declaration as the wire carries it back.
	s.Spec = spec.Sandbox{ID: s.SandboxID, Labels: s.Labels, Env: sb.Environment, Workdir: workdirOf(sb)}
	if sb.SourcesRef != nil && sb.SourcesRef.DiskImage != nil {
		s.Spec.Image = spec.Image{Ref: sb.SourcesRef.DiskImage.Name}
	}
	if sb.Resources != nil {
		s.Spec.Limits.CPU, s.Spec.Limits.Memory = spec.Quantity(sb.Resources.CPU), spec.Quantity(sb.Resources.Memory)
	}
	return s, true
}

func workdirOf(sb *sandboxJSON) string {
	if w, err := base64.RawURLEncoding.DecodeString(sb.Labels[labelWorkdir]); err == nil && path.IsAbs(string(w)) {
		return string(w)
	}
	return spec.DefaultWorkdir
}

// Get returns a sandbox this backend made; ErrNotFound once the data plane answers 404.
func (b *Backend) Get(ctx context.Context, sessionID string) (*sandbox.Session, error) {
	if err := checkID(sessionID); err != nil {
		return nil, err
	}
	sb, err := b.get(ctx, sessionID)
	if err != nil {
		return nil, fmt.Errorf("session %s: %w", sessionID, err)
	}
	s, ok := sessionFrom(sb)
	if !ok {
		return nil, fmt.Errorf("%w: session %s: sandbox %s of group %s was not made by airlock", sandbox.ErrNotFound, sessionID, sessionID, b.opts.SandboxGroup)
	}
	return s, nil
}

// listJSON is the list answer: {value, nextLink}; a bare array is also seen.
type listJSON struct {
	Value    []sandboxJSON `json:"value"`
	NextLink string        `json:"nextLink,omitempty"`
}

// List returns the live sandboxes this backend made in the group, oldest first.
func (b *Backend) List(ctx context.Context) ([]*sandbox.Session, error) {
	var all []sandboxJSON
	q := url.Values{"labels": {labelManaged + "=true"}}
	req, err := b.listPage(ctx, "/sandboxes", q)
	if err != nil {
		return nil, err
	}
	all = append(all, req.Value...)
	for pages := 0; req.NextLink != ""; pages++ {
		if pages > 1000 {
			return nil, fmt.Errorf("%w: list: more than 1000 pages", sandbox.ErrUnreachable)
		}
		if req, err = b.nextPage(ctx, req.NextLink); err != nil {
			return nil, err
		}
		all = append(all, req.Value...)
	}
	var out []*sandbox.Session
	for i := range all {
		if s, ok := sessionFrom(&all[i]); ok && s.State != sandbox.StateTerminated {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, c *sandbox.Session) int { return a.CreatedAt.Compare(c.CreatedAt) })
	return out, nil
}

func (b *Backend) listPage(ctx context.Context, p string, q url.Values) (*listJSON, error) {
	var raw rawList
	if err := b.data.call(ctx, http.MethodGet, p, q, nil, &raw); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return &raw.listJSON, nil
}

// nextPage follows a nextLink, which must stay on the data plane's host.
func (b *Backend) nextPage(ctx context.Context, link string) (*listJSON, error) {
	u, err := url.Parse(link)
	base, _ := url.Parse(b.data.base)
	if err != nil || u.Host != base.Host || u.Scheme != "https" {
		return nil, fmt.Errorf("%w: list: nextLink %q is not on the data plane %s", sandbox.ErrUnreachable, link, base.Host)
	}
	req, err := runtime.NewRequest(ctx, http.MethodGet, link)
	if err != nil {
		return nil, err
	}
	resp, err := b.data.pl.Do(req)
	if err != nil {
		return nil, transportError(http.MethodGet, "nextLink", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, classify(runtime.NewResponseError(resp))
	}
	var raw rawList
	if err := runtime.UnmarshalAsJSON(resp, &raw); err != nil {
		return nil, fmt.Errorf("%w: list: %v", sandbox.ErrUnreachable, err)
	}
	return &raw.listJSON, nil
}

// Connect returns the agent of a running sandbox: commands through executeShellCommand, files
// through the data plane's file operations.
func (b *Backend) Connect(ctx context.Context, sessionID string) (sandbox.Agent, error) {
	if err := checkID(sessionID); err != nil {
		return nil, err
	}
	sb, err := b.get(ctx, sessionID)
	if err != nil {
		return nil, fmt.Errorf("session %s: %w", sessionID, err)
	}
	s, ok := sessionFrom(sb)
	if !ok || s.State == sandbox.StateTerminated {
		return nil, fmt.Errorf("%w: session %s", sandbox.ErrNotFound, sessionID)
	}
	return b.agent(sessionID, s.SandboxID, workdirOf(sb)), nil
}

// Terminate deletes the sandbox and returns only once a GET answers 404. A throttle or a
// 5xx is an error (outcome unknown), never taken for "gone".
func (b *Backend) Terminate(ctx context.Context, sessionID string) error {
	if err := checkID(sessionID); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	err := b.data.call(ctx, http.MethodDelete, "/sandboxes/"+sessionID, nil, nil, nil)
	if err != nil && statusOf(err) != http.StatusNotFound {
		return fmt.Errorf("%w: terminate %s: %w", sandbox.ErrOutcomeUnknown, sessionID, err)
	}
	var state string
	for delay := 50 * time.Millisecond; ; {
		sb, err := b.get(ctx, sessionID)
		switch {
		case statusOf(err) == http.StatusNotFound:
			return nil
		case err != nil:
			return fmt.Errorf("%w: terminate %s: confirming it is gone: %w", sandbox.ErrOutcomeUnknown, sessionID, err)
		}
		state = sb.state()
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("%w: terminate %s: the sandbox still exists (state %q): %v", sandbox.ErrOutcomeUnknown, sessionID, state, err)
		}
		delay = min(delay*2, b.opts.PollInterval)
	}
}

// SetEgress replaces a running sandbox's egress policy (the data plane's policy replaces the
// whole policy, so nothing of the old one survives).
func (b *Backend) SetEgress(ctx context.Context, sessionID string, e spec.Egress) error {
	if err := checkID(sessionID); err != nil {
		return err
	}
	p, err := policyFor(e)
	if err != nil {
		return err
	}
	if _, err := b.Get(ctx, sessionID); err != nil {
		return err
	}
	if err := b.data.call(ctx, http.MethodPost, "/sandboxes/"+sessionID+"/egresspolicy", nil, p, nil); err != nil {
		return fmt.Errorf("set egress of %s: %w", sessionID, err)
	}
	return nil
}
