package aws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// Client is a small typed client of the MicroVM operations airlock uses, signed with SigV4.
type Client struct {
	// Endpoint is the API's base URL (default https://lambda.<region>.amazonaws.com).
	Endpoint *url.URL
	// Region signs every request; it must be the image's region (another gives a 404).
	Region      string
	Credentials awssdk.CredentialsProvider
	HTTP        *http.Client
	// MaxAttempts bounds the tries of one call through throttles and 5xx (default 5).
	MaxAttempts int
	signer      *v4.Signer
}

// NewClient returns a client; endpoint "" means the region's public endpoint.
func NewClient(region, endpoint string, creds awssdk.CredentialsProvider, hc *http.Client) (*Client, error) {
	if region == "" {
		return nil, fmt.Errorf("%w: aws.region is empty: name the region the MicroVM image lives in", sandbox.ErrInvalid)
	}
	if endpoint == "" {
		endpoint = "https://lambda." + region + ".amazonaws.com"
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("%w: aws.endpoint %q is not http(s)://host[:port]", sandbox.ErrInvalid, endpoint)
	}
	if creds == nil {
		return nil, fmt.Errorf("%w: aws: no credentials provider", sandbox.ErrInvalid)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	return &Client{Endpoint: u, Region: region, Credentials: creds, HTTP: hc, MaxAttempts: 5, signer: v4.NewSigner()}, nil
}

// APIError is an answer other than 2xx, decoded structurally: the status, and the error type
// from x-amzn-ErrorType (else the body's __type). errors.Is matches the sandbox error class the
// pair maps to; a 404 is "not found" only when its type says the resource is missing.
type APIError struct {
	Op         string
	Status     int
	Type       string
	Message    string
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	t := e.Type
	if t == "" {
		t = "no error type"
	}
	return fmt.Sprintf("aws %s: HTTP %d %s: %s", e.Op, e.Status, t, e.Message)
}

// Unwrap is the sandbox error class.
func (e *APIError) Unwrap() error {
	switch {
	case e.Status == http.StatusNotFound && e.Type == TypeNotFound:
		return sandbox.ErrNotFound
	case e.Status == http.StatusBadRequest:
		return sandbox.ErrInvalid
	case e.Status == http.StatusForbidden, e.Status == http.StatusUnauthorized:
		return sandbox.ErrForbidden
	case e.Status == http.StatusConflict:
		return sandbox.ErrConflict
	case e.Status == http.StatusPaymentRequired || e.Type == TypeQuotaExceeded:
		return sandbox.ErrRefused
	}
	// Throttles, 5xx and a 404 that does not say the resource is missing (a wrong region):
	// the service could not be asked, which is never "gone".
	return sandbox.ErrUnreachable
}

// Retryable says whether the same call may succeed if tried again.
func (e *APIError) Retryable() bool {
	return e.Status == http.StatusTooManyRequests || e.Status >= 500 || e.Type == TypeThrottling
}

// IsNotFound reports whether err is the API saying the MicroVM does not exist.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Type == TypeNotFound
}

// call sends one operation, retrying throttles and 5xx (every operation airlock uses is
// idempotent: Run carries a client token), and decodes a 2xx JSON answer into out. An empty
// 2xx body decodes as {}.
func (c *Client) call(ctx context.Context, op, method, path string, query url.Values, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("%w: aws %s: %v", sandbox.ErrInvalid, op, err)
		}
	}
	attempts := max(c.MaxAttempts, 1)
	var last error
	for i := range attempts {
		err := c.once(ctx, op, method, path, query, body, out)
		if err == nil {
			return nil
		}
		last = err
		var ae *APIError
		wait := backoff(i)
		switch {
		case errors.As(err, &ae) && ae.Retryable():
			if ae.RetryAfter > 0 {
				wait = ae.RetryAfter
			}
		case errors.As(err, &ae), ctx.Err() != nil:
			return err
		}
		if i == attempts-1 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (retrying: %v)", last, ctx.Err())
		case <-t.C:
		}
	}
	return last
}

func backoff(i int) time.Duration {
	return min(100*time.Millisecond<<i, 5*time.Second)
}

func (c *Client) once(ctx context.Context, op, method, path string, query url.Values, body []byte, out any) error {
	u := *c.Endpoint
	u.Path = strings.TrimSuffix(u.Path, "/") + "/" + APIVersion + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fmt.Errorf("%w: aws %s: %v", sandbox.ErrInvalid, op, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	creds, err := c.Credentials.Retrieve(ctx)
	if err != nil {
		return fmt.Errorf("%w: aws credentials: %v", sandbox.ErrUnauthenticated, err)
	}
	sum := sha256.Sum256(body)
	if err := c.signer.SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), SigningService, c.Region, time.Now().UTC()); err != nil {
		return fmt.Errorf("aws %s: sign: %w", op, err)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if method == http.MethodGet {
			return fmt.Errorf("%w: aws %s: %w", sandbox.ErrUnreachable, op, err)
		}
		return fmt.Errorf("%w: aws %s: %w", sandbox.ErrOutcomeUnknown, op, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%w: aws %s: read answer: %v", sandbox.ErrOutcomeUnknown, op, err)
	}
	if resp.StatusCode/100 != 2 {
		return decodeAPIError(op, resp, raw)
	}
	if out == nil || len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%w: aws %s: decode answer: %v", sandbox.ErrOutcomeUnknown, op, err)
	}
	return nil
}

// decodeAPIError reads the error type from the header (its part before ':'), else the body's
// __type (its part after '#'); the message never decides the class.
func decodeAPIError(op string, resp *http.Response, raw []byte) error {
	e := &APIError{Op: op, Status: resp.StatusCode}
	var b ErrorBody
	_ = json.Unmarshal(raw, &b)
	e.Type = resp.Header.Get("X-Amzn-Errortype")
	if e.Type == "" {
		e.Type = b.Type
		if _, after, ok := strings.Cut(e.Type, "#"); ok {
			e.Type = after
		}
	}
	e.Type, _, _ = strings.Cut(e.Type, ":")
	e.Message = b.Message
	if e.Message == "" {
		e.Message = strings.TrimSpace(string(raw))
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	} else if b.RetryAfterSeconds > 0 {
		e.RetryAfter = time.Duration(b.RetryAfterSeconds) * time.Second
	}
	return e
}

func escape(id string) string { return url.PathEscape(id) }

// Run is RunMicrovm.
func (c *Client) Run(ctx context.Context, r RunRequest) (*Microvm, error) {
	var m Microvm
	if err := c.call(ctx, "RunMicrovm", http.MethodPost, "/microvms", nil, r, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Get is GetMicrovm.
func (c *Client) Get(ctx context.Context, id string) (*Microvm, error) {
	var m Microvm
	if err := c.call(ctx, "GetMicrovm", http.MethodGet, "/microvms/"+escape(id), nil, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Terminate is TerminateMicrovm (idempotent on the service's side).
func (c *Client) Terminate(ctx context.Context, id string) error {
	return c.call(ctx, "TerminateMicrovm", http.MethodDelete, "/microvms/"+escape(id), nil, nil, nil)
}

// Suspend is SuspendMicrovm.
func (c *Client) Suspend(ctx context.Context, id string) error {
	return c.call(ctx, "SuspendMicrovm", http.MethodPost, "/microvms/"+escape(id)+"/suspend", nil, struct{}{}, nil)
}

// Resume is ResumeMicrovm.
func (c *Client) Resume(ctx context.Context, id string) error {
	return c.call(ctx, "ResumeMicrovm", http.MethodPost, "/microvms/"+escape(id)+"/resume", nil, struct{}{}, nil)
}

// AuthToken is CreateMicrovmAuthToken for one port: the headers to send through the endpoint.
func (c *Client) AuthToken(ctx context.Context, id string, port int, minutes int) (map[string]string, error) {
	var r AuthTokenResponse
	in := AuthTokenRequest{AllowedPorts: []AllowedPort{{Port: &port}}, ExpirationInMinutes: minutes}
	if err := c.call(ctx, "CreateMicrovmAuthToken", http.MethodPost, "/microvms/"+escape(id)+"/auth-token", nil, in, &r); err != nil {
		return nil, err
	}
	if len(r.AuthToken) == 0 {
		return nil, fmt.Errorf("%w: aws CreateMicrovmAuthToken answered no token", sandbox.ErrOutcomeUnknown)
	}
	return r.AuthToken, nil
}

// List is ListMicrovms of one image, every page.
func (c *Client) List(ctx context.Context, image string) ([]MicrovmItem, error) {
	var out []MicrovmItem
	q := url.Values{"imageIdentifier": {image}, "maxResults": {"50"}}
	for {
		var page ListResponse
		if err := c.call(ctx, "ListMicrovms", http.MethodGet, "/microvms", q, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if page.NextToken == nil || *page.NextToken == "" {
			return out, nil
		}
		q.Set("nextToken", *page.NextToken)
	}
}

// CreateImage is CreateMicrovmImage: it answers as soon as the build is accepted.
func (c *Client) CreateImage(ctx context.Context, r CreateImageRequest) (*ImageAnswer, error) {
	var a ImageAnswer
	if err := c.call(ctx, "CreateMicrovmImage", http.MethodPost, "/microvm-images", nil, r, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// UpdateImage is UpdateMicrovmImage: a new version of image arn, built from r.
func (c *Client) UpdateImage(ctx context.Context, arn string, r UpdateImageRequest) (*ImageAnswer, error) {
	if err := CheckImageArn(arn); err != nil {
		return nil, err
	}
	var a ImageAnswer
	if err := c.call(ctx, "UpdateMicrovmImage", http.MethodPut, "/microvm-images/"+arn, nil, r, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// GetImage is GetMicrovmImage.
func (c *Client) GetImage(ctx context.Context, arn string) (*MicrovmImage, error) {
	if err := CheckImageArn(arn); err != nil {
		return nil, err
	}
	var m MicrovmImage
	if err := c.call(ctx, "GetMicrovmImage", http.MethodGet, "/microvm-images/"+arn, nil, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// GetImageVersion is GetMicrovmImageVersion: where a build's state and reason are.
func (c *Client) GetImageVersion(ctx context.Context, arn, version string) (*ImageVersion, error) {
	if err := checkImageVersion(arn, version); err != nil {
		return nil, err
	}
	var v ImageVersion
	if err := c.call(ctx, "GetMicrovmImageVersion", http.MethodGet, "/microvm-images/"+arn+"/versions/"+version, nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// ListImageBuilds is ListMicrovmImageBuilds of one version, every page: a failed build's
// stateReason is where the service says why.
func (c *Client) ListImageBuilds(ctx context.Context, arn, version string) ([]ImageBuild, error) {
	if err := checkImageVersion(arn, version); err != nil {
		return nil, err
	}
	var out []ImageBuild
	q := url.Values{}
	for {
		var page ImageBuildList
		if err := c.call(ctx, "ListMicrovmImageBuilds", http.MethodGet, "/microvm-images/"+arn+"/versions/"+version+"/builds", q, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if page.NextToken == nil || *page.NextToken == "" {
			return out, nil
		}
		q.Set("nextToken", *page.NextToken)
	}
}

func checkImageVersion(arn, version string) error {
	if err := CheckImageArn(arn); err != nil {
		return err
	}
	if !versionRE().MatchString(version) {
		return fmt.Errorf("%w: image version %q: a version is like 1.0", sandbox.ErrInvalid, version)
	}
	return nil
}
