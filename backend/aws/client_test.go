package aws_test

import (
	"context"
	"errors"
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/aws/fake"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// noGuests is a fake whose MicroVMs never boot: enough for the API's own behaviour.
func noGuests(t *testing.T) *fake.Server {
	f := fake.New(testRegion, func(context.Context, fake.RunInfo) (fake.Guest, error) {
		return nil, errors.New("no guests in this test")
	})
	f.Images = []string{testImage}
	t.Cleanup(f.Close)
	return f
}

func apiClient(t *testing.T, f *fake.Server, region string, creds awssdk.CredentialsProvider) *awsb.Client {
	t.Helper()
	c, err := awsb.NewClient(region, f.URL(), creds, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.HTTP.CloseIdleConnections)
	return c
}

func static(ak, sk string) awssdk.CredentialsProvider {
	return awssdk.CredentialsProviderFunc(func(context.Context) (awssdk.Credentials, error) {
		return awssdk.Credentials{AccessKeyID: ak, SecretAccessKey: sk}, nil
	})
}

// TestSigV4: the fake checks signatures as the service does, and a refusal is never "not found".
func TestSigV4(t *testing.T) {
	f := noGuests(t)
	cases := []struct {
		name     string
		region   string
		creds    awssdk.CredentialsProvider
		wantType string
		class    error
	}{
		{name: "signed right, unknown MicroVM", region: testRegion, creds: fake.Credentials(), wantType: awsb.TypeNotFound, class: sandbox.ErrNotFound},
		{name: "wrong secret", region: testRegion, creds: static(fake.AccessKey, "not-the-secret"), wantType: "InvalidSignatureException", class: sandbox.ErrForbidden},
		{name: "unknown key", region: testRegion, creds: static("AKIDUNKNOWN", fake.SecretKey), wantType: "UnrecognizedClientException", class: sandbox.ErrForbidden},
		// The real service answers another region's signature with a 404: not a missing MicroVM.
		{name: "wrong region", region: "us-east-1", creds: fake.Credentials(), wantType: "", class: sandbox.ErrUnreachable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := apiClient(t, f, tc.region, tc.creds)
			_, err := c.Get(t.Context(), "mvm-absent")
			var ae *awsb.APIError
			if !errors.As(err, &ae) || ae.Type != tc.wantType || !errors.Is(err, tc.class) {
				t.Fatalf("Get = %v, want type %q and class %v", err, tc.wantType, tc.class)
			}
			if tc.class != sandbox.ErrNotFound && (errors.Is(err, sandbox.ErrNotFound) || awsb.IsNotFound(err)) {
				t.Errorf("Get = %v is classed as not found", err)
			}
		})
	}
}

// TestErrorClasses: an answer's class comes from its status and type, never from its text.
func TestErrorClasses(t *testing.T) {
	f := noGuests(t)
	c := apiClient(t, f, testRegion, fake.Credentials())
	c.MaxAttempts = 1
	cases := []struct {
		name     string
		fault    fake.Fault
		class    error
		notFound bool
	}{
		{"404 not-found whose message talks of throttling", fake.Fault{Status: 404, Type: awsb.TypeNotFound, Body: `{"message":"ThrottlingException: Rate exceeded (429)"}`}, sandbox.ErrNotFound, true},
		{"404 not-found with the type only in the body", fake.Fault{Status: 404, Body: `{"__type":"com.amazonaws.lambda#ResourceNotFoundException","message":"gone"}`}, sandbox.ErrNotFound, true},
		{"429 whose body names a missing resource", fake.Fault{Status: 429, Type: awsb.TypeThrottling, Body: `{"message":"ResourceNotFoundException 404"}`}, sandbox.ErrUnreachable, false},
		{"500 whose body says not found", fake.Fault{Status: 500, Type: awsb.TypeInternal, Body: `not found`}, sandbox.ErrUnreachable, false},
		{"502 empty", fake.Fault{Status: 502}, sandbox.ErrUnreachable, false},
		{"402 quota", fake.Fault{Status: 402, Type: awsb.TypeQuotaExceeded, Message: "quota"}, sandbox.ErrRefused, false},
		{"400 validation", fake.Fault{Status: 400, Type: awsb.TypeValidation, Message: "bad"}, sandbox.ErrInvalid, false},
		{"409 conflict", fake.Fault{Status: 409, Type: awsb.TypeConflict, Message: "busy"}, sandbox.ErrConflict, false},
		{"403 denied", fake.Fault{Status: 403, Type: awsb.TypeAccessDenied + ":http://internal.amazon.com/", Message: "no"}, sandbox.ErrForbidden, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.Inject("GetMicrovm", tc.fault)
			_, err := c.Get(t.Context(), "mvm-any")
			if !errors.Is(err, tc.class) {
				t.Errorf("Get = %v, want class %v", err, tc.class)
			}
			if awsb.IsNotFound(err) != tc.notFound {
				t.Errorf("IsNotFound(%v) = %v, want %v", err, awsb.IsNotFound(err), tc.notFound)
			}
		})
	}
}

// TestRunRequestModel: what the fake refuses as the model does (the idle policy's members are
// all required, a bare image name is not an ARN).
func TestRunRequestModel(t *testing.T) {
	f := noGuests(t)
	c := apiClient(t, f, testRegion, fake.Credentials())
	payload := `{"sandboxId":"x","sessionId":"microvm","keyRing":"k"}`
	for _, r := range []awsb.RunRequest{
		{ImageIdentifier: "airlock-test", RunHookPayload: payload},
		{ImageIdentifier: testImage, RunHookPayload: payload, IdlePolicy: &awsb.IdlePolicy{MaxIdleDurationSeconds: 30}},
		{ImageIdentifier: testImage, RunHookPayload: payload, MaximumDurationInSeconds: 28801},
	} {
		if _, err := c.Run(t.Context(), r); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("Run(%+v) = %v, want a validation error", r, err)
		}
	}
}
