package kernfile

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseProcCgroup(t *testing.T) {
	for _, tt := range []struct {
		name    string
		in      string
		want    []CgroupMembership
		unified string // UnifiedPath's answer; "-" none
		wantErr bool
	}{
		{name: "v1", in: "9:name=systemd:/\n4:memory:/process_api/459d\n3:cpu,cpuacct:/\n", want: []CgroupMembership{
			{HierarchyID: 9, Controllers: []string{"name=systemd"}, Path: "/"},
			{HierarchyID: 4, Controllers: []string{"memory"}, Path: "/process_api/459d"},
			{HierarchyID: 3, Controllers: []string{"cpu", "cpuacct"}, Path: "/"},
		}, unified: "-"},
		{name: "v2", in: "0::/user.slice/session-2.scope\n", want: []CgroupMembership{
			{HierarchyID: 0, Path: "/user.slice/session-2.scope"},
		}, unified: "/user.slice/session-2.scope"},
		{name: "hybrid", in: "5:pids:/a\n\n0::/b\n", want: []CgroupMembership{
			{HierarchyID: 5, Controllers: []string{"pids"}, Path: "/a"},
			{HierarchyID: 0, Path: "/b"},
		}, unified: "/b"},
		{name: "path with colon", in: "0::/a:b\n", want: []CgroupMembership{{HierarchyID: 0, Path: "/a:b"}}, unified: "/a:b"},
		{name: "two fields", in: "0:/x\n", wantErr: true},
		{name: "bad id", in: "x::/\n", wantErr: true},
		{name: "negative id", in: "-1::/\n", wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseProcCgroup(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
			p, ok := UnifiedPath(got)
			if !ok {
				p = "-"
			}
			if p != tt.unified {
				t.Errorf("UnifiedPath %q, want %q", p, tt.unified)
			}
		})
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:         "/plain",
		`/with\040space`: "/with space",
		`/tab\011nl\012`: "/tab\tnl\n",
		`/back\134slash`: `/back\slash`,
		`/short\04`:      `/short\04`,
		`/not\999octal`:  `/not\999octal`,
		`\040`:           " ",
		`/end\`:          `/end\`,
	} {
		if got := UnescapeMount(in); got != want {
			t.Errorf("UnescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
