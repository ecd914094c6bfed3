package aws_test

import (
	"reflect"
	"testing"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/capability"
)

// TestPublishedIsTheDesign: capability's aws set (what plan reads where no backend is
// configured) is the set this backend publishes and its Create checks.
func TestPublishedIsTheDesign(t *testing.T) {
	design, err := capability.For(capability.AWS)
	if err != nil {
		t.Fatal(err)
	}
	if pub := awsb.Published(); !reflect.DeepEqual(design, pub) {
		for _, n := range capability.Names {
			if design.Entries[n] != pub.Entries[n] {
				t.Errorf("%s: capability's %+v, backend/aws's %+v", n, design.Entries[n], pub.Entries[n])
			}
		}
		t.Errorf("bounds %+v / %+v, platform values %v / %v", design.Bounds, pub.Bounds, design.PlatformValues, pub.PlatformValues)
	}
}
