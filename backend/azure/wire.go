package azure

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// The wire as ../shared/notes/cloud-apis.md §2 reads it. Where the readings disagree (the
// sandbox's state field, the list's shape, the file list's field names) both are accepted.

// sandboxJSON is a sandbox as the data plane returns it.
type sandboxJSON struct {
	ID string `json:"id"`
	// State is what Microsoft's SDK reads; Status what alien reads. Whichever is set counts.
	State        string            `json:"state,omitempty"`
	Status       string            `json:"status,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	CreatedAt    string            `json:"createdAt,omitempty"`
	SourcesRef   *sourcesRef       `json:"sourcesRef,omitempty"`
	Resources    *resources        `json:"resources,omitempty"`
	EgressPolicy *egressPolicy     `json:"egressPolicy,omitempty"`
	Environment  map[string]string `json:"environment,omitempty"`
	StateDetails *struct {
		StoppedReason string `json:"stoppedReason,omitempty"`
	} `json:"stateDetails,omitempty"`
}

// state is the sandbox's lifecycle state, from state or status.
func (s *sandboxJSON) state() string {
	if s.State != "" {
		return s.State
	}
	return s.Status
}

type sourcesRef struct {
	DiskImage *diskImage `json:"diskImage,omitempty"`
}

type diskImage struct {
	Name     string `json:"name,omitempty"`
	ID       string `json:"id,omitempty"`
	IsPublic bool   `json:"isPublic,omitempty"`
}

type resources struct {
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// egressPolicy is the per-sandbox policy: defaultAction Allow|Deny, host rules first-match.
type egressPolicy struct {
	DefaultAction     string     `json:"defaultAction"`
	TrafficInspection string     `json:"trafficInspection,omitempty"`
	HostRules         []hostRule `json:"hostRules,omitempty"`
}

type hostRule struct {
	Pattern string `json:"pattern"`
	Action  string `json:"action"`
}

// createBody is PUT /sandboxes: the service assigns the id.
type createBody struct {
	SourcesRef   sourcesRef        `json:"sourcesRef"`
	Resources    resources         `json:"resources"`
	Labels       map[string]string `json:"labels,omitempty"`
	EgressPolicy *egressPolicy     `json:"egressPolicy,omitempty"`
	Environment  map[string]string `json:"environment,omitempty"`
}

// execBody and execResult are POST executeShellCommand: synchronous, no timeout field.
type execBody struct {
	Command          string `json:"command"`
	WorkingDirectory string `json:"workingDirectory,omitempty"`
}

type execResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// ExitCode may be absent on the live service: the wrapper's trailer carries the status.
	ExitCode *int `json:"exitCode,omitempty"`
}

// groupJSON is the ARM sandbox group.
type groupJSON struct {
	ID         string `json:"id,omitempty"`
	Name       string `json:"name,omitempty"`
	Location   string `json:"location"`
	Properties *struct {
		ProvisioningState string `json:"provisioningState,omitempty"`
	} `json:"properties,omitempty"`
}

// wire is one plane: its pipeline (bearer token for its audience, retries) and base URL.
type wire struct {
	pl         runtime.Pipeline
	base       string // scheme://host/...path, no trailing slash
	apiVersion string
}

// noReplay are the retry options of calls the service may have acted on before failing: a
// command, or a create whose id the service assigns. Only a 429 (the service refused before
// acting) is retried; a 5xx or a broken connection is not, so nothing runs twice.
var noReplay = policy.RetryOptions{
	ShouldRetry: func(resp *http.Response, err error) bool {
		return err == nil && resp != nil && resp.StatusCode == http.StatusTooManyRequests
	},
}

// call sends one request and decodes a 2xx JSON answer into out (nil: discard). Errors are
// classified by status (classify); the body's text is never read for a status.
func (w *wire) call(ctx context.Context, method, path string, query url.Values, body any, out any) error {
	req, err := w.request(ctx, method, path, query)
	if err != nil {
		return err
	}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		if err := req.SetBody(streaming.NopCloser(bytes.NewReader(b)), "application/json"); err != nil {
			return err
		}
	}
	resp, err := w.pl.Do(req)
	if err != nil {
		return transportError(method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return classify(runtime.NewResponseError(resp))
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return transportError(method, path, err)
	}
	if len(b) > maxAnswer {
		return fmt.Errorf("%w: %s %s: answer larger than %d bytes", sandbox.ErrTooLarge, method, path, maxAnswer)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%w: %s %s: undecodable answer: %v", sandbox.ErrUnreachable, method, path, err)
	}
	return nil
}

// maxAnswer bounds a JSON answer (an exec's output comes back whole in one).
const maxAnswer = 256 << 20

func (w *wire) request(ctx context.Context, method, path string, query url.Values) (*policy.Request, error) {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	q.Set("api-version", w.apiVersion)
	req, err := runtime.NewRequest(ctx, method, w.base+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %v", sandbox.ErrInvalid, method, path, err)
	}
	req.Raw().Header.Set("Accept", "application/json")
	return req, nil
}

// raw sends one request with a raw body (nil: none) and returns a 2xx answer's body, at most
// limit bytes.
func (w *wire) raw(ctx context.Context, method, path string, query url.Values, body []byte, limit int64) ([]byte, error) {
	req, err := w.request(ctx, method, path, query)
	if err != nil {
		return nil, err
	}
	if body != nil {
		if err := req.SetBody(streaming.NopCloser(bytes.NewReader(body)), "application/octet-stream"); err != nil {
			return nil, err
		}
	}
	resp, err := w.pl.Do(req)
	if err != nil {
		return nil, transportError(method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, classify(runtime.NewResponseError(resp))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, transportError(method, path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s %s: more than %d bytes", sandbox.ErrTooLarge, method, path, limit)
	}
	return b, nil
}

// transportError is a request that got no answer: the service may or may not have acted.
func transportError(method, path string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s %s: %w", sandbox.ErrDeadlineExceeded, method, path, err)
	}
	return fmt.Errorf("%w: %s %s: %v", sandbox.ErrUnreachable, method, path, err)
}

// httpError is an answer with a non-2xx status, classified into a sandbox error class by the
// status alone: a 500 whose body says "404" is a 500.
type httpError struct {
	class error
	resp  *azcore.ResponseError
	hint  string
	// message is the body's error.message, for people; never read for a status.
	message string
}

func (e *httpError) Error() string {
	s := fmt.Sprintf("%v: azure answered %d", e.class, e.resp.StatusCode)
	if e.resp.ErrorCode != "" {
		s += " " + e.resp.ErrorCode
	}
	if r := e.resp.RawResponse; r != nil && r.Request != nil {
		s += " to " + r.Request.Method + " " + r.Request.URL.Path
	}
	if e.hint != "" {
		s += " (" + e.hint + ")"
	}
	if e.message != "" {
		s += ": " + e.message
	}
	return s
}

// Unwrap gives both the sandbox error class and the *azcore.ResponseError.
func (e *httpError) Unwrap() []error { return []error{e.class, e.resp} }

// classify maps an azcore error to the sandbox error classes by HTTP status.
func classify(err error) error {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("%w: %v", sandbox.ErrUnreachable, err)
	}
	e := &httpError{resp: re}
	if re.RawResponse != nil {
		if b, err := runtime.Payload(re.RawResponse); err == nil {
			var body struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if json.Unmarshal(b, &body) == nil {
				e.message = body.Error.Message
			}
			if len(e.message) > 500 {
				e.message = e.message[:500] + "..."
			}
		}
	}
	switch s := re.StatusCode; {
	case s == http.StatusNotFound:
		e.class = sandbox.ErrNotFound
	case s == http.StatusBadRequest || s == http.StatusUnprocessableEntity:
		e.class = sandbox.ErrInvalid
	case s == http.StatusUnauthorized:
		e.class = sandbox.ErrUnauthenticated
	case s == http.StatusForbidden:
		e.class = sandbox.ErrForbidden
		e.hint = "the data plane needs the role Container Apps SandboxGroup Data Owner on the sandbox group or its resource group; Owner alone is refused, and a new assignment takes a minute to apply"
	case s == http.StatusConflict || s == http.StatusPreconditionFailed:
		e.class = sandbox.ErrConflict
	case s == http.StatusRequestEntityTooLarge:
		e.class = sandbox.ErrTooLarge
	case s == http.StatusTooManyRequests:
		e.class = sandbox.ErrUnreachable
		e.hint = "throttled"
	default:
		e.class = sandbox.ErrUnreachable
	}
	return e
}

// statusOf is the HTTP status an error carries structurally, 0 when it carries none.
func statusOf(err error) int {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return re.StatusCode
	}
	return 0
}
