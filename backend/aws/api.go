package aws

// The MicroVM API's wire shapes (REST-JSON, paths under /2025-09-09/; notes/cloud-apis.md §1.2).

// APIVersion prefixes every path of the MicroVM API.
const APIVersion = "2025-09-09"

// SigningService is the SigV4 service name the MicroVM API is signed for.
const SigningService = "lambda"

// MicroVM states as the API reports them.
const (
	StatePending     = "PENDING"
	StateRunning     = "RUNNING"
	StateSuspending  = "SUSPENDING"
	StateSuspended   = "SUSPENDED"
	StateTerminating = "TERMINATING"
	StateTerminated  = "TERMINATED"
)

// Error types the API documents (x-amzn-ErrorType).
const (
	TypeValidation    = "ValidationException"
	TypeAccessDenied  = "AccessDeniedException"
	TypeNotFound      = "ResourceNotFoundException"
	TypeConflict      = "ConflictException"
	TypeThrottling    = "ThrottlingException"
	TypeInternal      = "InternalServerException"
	TypeQuotaExceeded = "ServiceQuotaExceededException"
)

// ProxyAuthHeader is the header CreateMicrovmAuthToken's token travels in; ProxyPortHeader
// names the guest port a request through the endpoint is for.
const (
	ProxyAuthHeader = "X-Aws-Proxy-Auth"
	ProxyPortHeader = "X-Aws-Proxy-Port"
)

// IdlePolicy is RunMicrovm's idle block; when present the model requires all three members.
type IdlePolicy struct {
	MaxIdleDurationSeconds   int64 `json:"maxIdleDurationSeconds"`
	SuspendedDurationSeconds int64 `json:"suspendedDurationSeconds"`
	AutoResumeEnabled        bool  `json:"autoResumeEnabled"`
}

// RunRequest is RunMicrovm's body.
type RunRequest struct {
	ImageIdentifier          string      `json:"imageIdentifier"`
	ImageVersion             string      `json:"imageVersion,omitempty"`
	ClientToken              string      `json:"clientToken,omitempty"`
	EgressNetworkConnectors  []string    `json:"egressNetworkConnectors,omitempty"`
	IngressNetworkConnectors []string    `json:"ingressNetworkConnectors,omitempty"`
	ExecutionRoleArn         string      `json:"executionRoleArn,omitempty"`
	IdlePolicy               *IdlePolicy `json:"idlePolicy,omitempty"`
	MaximumDurationInSeconds int64       `json:"maximumDurationInSeconds,omitempty"`
	Logging                  *Logging    `json:"logging,omitempty"`
	RunHookPayload           string      `json:"runHookPayload,omitempty"`
}

// Logging is a union: exactly one member.
type Logging struct {
	CloudWatch *CloudWatch `json:"cloudWatch,omitempty"`
	Disabled   *struct{}   `json:"disabled,omitempty"`
}

// CloudWatch names where a MicroVM's logs go.
type CloudWatch struct {
	LogGroup  string `json:"logGroup,omitempty"`
	LogStream string `json:"logStream,omitempty"`
}

// Microvm is what RunMicrovm and GetMicrovm answer. Timestamps are epoch seconds.
type Microvm struct {
	MicrovmID                string      `json:"microvmId"`
	State                    string      `json:"state"`
	StateReason              string      `json:"stateReason,omitempty"`
	Endpoint                 string      `json:"endpoint,omitempty"`
	ImageArn                 string      `json:"imageArn,omitempty"`
	ImageVersion             string      `json:"imageVersion,omitempty"`
	ExecutionRoleArn         string      `json:"executionRoleArn,omitempty"`
	IdlePolicy               *IdlePolicy `json:"idlePolicy,omitempty"`
	MaximumDurationInSeconds int64       `json:"maximumDurationInSeconds,omitempty"`
	StartedAt                float64     `json:"startedAt,omitempty"`
	TerminatedAt             float64     `json:"terminatedAt,omitempty"`
	EgressNetworkConnectors  []string    `json:"egressNetworkConnectors,omitempty"`
	IngressNetworkConnectors []string    `json:"ingressNetworkConnectors,omitempty"`
}

// MicrovmItem is one entry of ListMicrovms.
type MicrovmItem struct {
	MicrovmID    string  `json:"microvmId"`
	State        string  `json:"state"`
	ImageArn     string  `json:"imageArn,omitempty"`
	ImageVersion string  `json:"imageVersion,omitempty"`
	StartedAt    float64 `json:"startedAt,omitempty"`
}

// ListResponse is a page of ListMicrovms; NextToken is empty on the last.
type ListResponse struct {
	Items     []MicrovmItem `json:"items"`
	NextToken *string       `json:"nextToken,omitempty"`
}

// PortRange is a range of guest ports.
type PortRange struct {
	StartPort int `json:"startPort"`
	EndPort   int `json:"endPort"`
}

// AllowedPort is a tagged union: exactly one member.
type AllowedPort struct {
	Port     *int       `json:"port,omitempty"`
	Range    *PortRange `json:"range,omitempty"`
	AllPorts *struct{}  `json:"allPorts,omitempty"`
}

// AuthTokenRequest is CreateMicrovmAuthToken's body.
type AuthTokenRequest struct {
	AllowedPorts        []AllowedPort `json:"allowedPorts"`
	ExpirationInMinutes int           `json:"expirationInMinutes"`
}

// AuthTokenResponse carries the headers every request through the endpoint must send.
type AuthTokenResponse struct {
	AuthToken map[string]string `json:"authToken"`
}

// ErrorBody is the JSON body of an error answer.
type ErrorBody struct {
	Type              string `json:"__type,omitempty"`
	Message           string `json:"message,omitempty"`
	RetryAfterSeconds int    `json:"retryAfterSeconds,omitempty"`
	ResourceID        string `json:"resourceId,omitempty"`
	ResourceType      string `json:"resourceType,omitempty"`
}
