package imagearg

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in    string
		kind  Kind
		value string
	}{
		{"", None, ""},
		{"host", Host, "host"},
		{"hostx", Ref, "hostx"},
		{"oci:./l", OCILayout, "./l"},
		{"oci-layout:/l", OCILayout, "/l"},
		{"oci:", OCILayout, ""},
		{"oci-layout:oci:", OCILayout, ""},
		{"/a/b.tar", Tarball, "/a/b.tar"},
		{"x.tar.gz", Tarball, "x.tar.gz"},
		{"./x.tgz", Tarball, "./x.tgz"},
		{".", Dir, "."},
		{"..", Dir, ".."},
		{"/srv/root", Dir, "/srv/root"},
		{"./r", Dir, "./r"},
		{"../r", Dir, "../r"},
		{"rootfs", Ref, "rootfs"},
		{"python:3.12", Ref, "python:3.12"},
	} {
		k, v := Parse(tc.in)
		if k != tc.kind || v != tc.value {
			t.Errorf("Parse(%q) = %v %q, want %v %q", tc.in, k, v, tc.kind, tc.value)
		}
	}
}
