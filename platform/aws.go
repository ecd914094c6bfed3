package platform

import (
	"context"
	"fmt"
	"os"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// AWSConfig says where Lambda MicroVMs run and from what (backend/aws' Config). Credentials
// come from the SDK's default chain ($AWS_ACCESS_KEY_ID..., ~/.aws, SSO, the instance's role).
type AWSConfig struct {
	// Region is the MicroVM image's region (default $AWS_REGION, else $AWS_DEFAULT_REGION).
	Region string `json:"region,omitempty"`
	// Endpoint overrides the MicroVM API's URL (a fake, a VPC endpoint).
	Endpoint string `json:"endpoint,omitempty"`
	// Image is the MicroVM image's ARN; ImageVersion its version ("" the latest active);
	// ImageRef the reference it was built from, which a declaration's image.ref must name.
	Image        string `json:"image,omitempty"`
	ImageVersion string `json:"imageVersion,omitempty"`
	ImageRef     string `json:"imageRef,omitempty"`
	// EgressConnector is the ARN of the VPC egress connector a deny sandbox runs behind.
	EgressConnector string `json:"egressConnector,omitempty"`
	// StateDir holds the master secret our agents' tokens derive from (default
	// /var/lib/airlock-aws for root, else ~/.config/airlock/aws).
	StateDir string `json:"stateDir,omitempty"`
	// ImageBucket is the S3 bucket 'airlock image push' uploads bundles to, BuildRole the role
	// image builds assume, S3Endpoint an override of S3's URL (a fake, a VPC endpoint;
	// path-style).
	ImageBucket string `json:"imageBucket,omitempty"`
	BuildRole   string `json:"buildRole,omitempty"`
	S3Endpoint  string `json:"s3Endpoint,omitempty"`
}

// AWSRegion is the region the aws section names, else $AWS_REGION, else $AWS_DEFAULT_REGION.
func AWSRegion(a AWSConfig) string {
	for _, r := range []string{a.Region, os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION")} {
		if r != "" {
			return r
		}
	}
	return ""
}

// openAWS makes the aws backend; it calls no API until a sandbox is asked for.
func openAWS(ctx context.Context, c Config) (Backend, string, error) {
	a := c.AWS
	a.Region = AWSRegion(a)
	if a.Region == "" {
		return nil, "", fmt.Errorf("%w: aws.region is not set (config file, $AWS_REGION): name the region of the MicroVM image", sandbox.ErrInvalid)
	}
	b, err := awsb.New(ctx, awsb.Config{Region: a.Region, Endpoint: a.Endpoint, Image: a.Image, ImageVersion: a.ImageVersion,
		ImageRef: a.ImageRef, EgressConnector: a.EgressConnector, StateDir: a.StateDir, Logger: c.Logger})
	if err != nil {
		return nil, "", err
	}
	return b, fmt.Sprintf("Lambda MicroVMs in %s, image %s", a.Region, a.Image), nil
}

// publishedAWS is the aws backend's published set.
func publishedAWS() capability.Set { return awsb.Published() }
