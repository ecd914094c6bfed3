package operator

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

var testPodOpts = PodOptions{AirlockImage: "airlock.local/airlock:dev", PullPolicy: corev1.PullIfNotPresent,
	AgentPort: DefaultAgentPort, OperatorNS: "airlock-system",
	BrokerSelector: map[string]string{"app.kubernetes.io/name": "airlock-operator"}, GVisorClassName: "gvisor"}

func testRing(t *testing.T) (string, ed25519.PrivateKey) {
	t.Helper()
	key, err := token.DeriveKey([]byte(strings.Repeat("m", 32)), "ns/box")
	if err != nil {
		t.Fatal(err)
	}
	b, err := token.NewKeyRing(key.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	return string(b), key
}

func buildTestPod(t *testing.T, mut func(*spec.Sandbox)) (*corev1.Pod, spec.Sandbox) {
	t.Helper()
	sb := sbx("box", nil)
	if mut != nil {
		mut(&sb.Spec.Sandbox)
	}
	d, err := Accept(sb)
	if err != nil {
		t.Fatal(err)
	}
	ring, _ := testRing(t)
	p, err := BuildPod(sb, d, testPodOpts, ring, "sess1", "tmpl", 1_000_007)
	if err != nil {
		t.Fatal(err)
	}
	return p, d
}

func TestBuildPodIsHardened(t *testing.T) {
	p, _ := buildTestPod(t, nil)
	s := p.Spec
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Error("service account token is mounted")
	}
	if s.EnableServiceLinks == nil || *s.EnableServiceLinks {
		t.Error("service links are enabled")
	}
	if s.HostNetwork || s.HostPID || s.HostIPC {
		t.Error("pod shares a host namespace")
	}
	if s.SecurityContext == nil || s.SecurityContext.SeccompProfile == nil || s.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("no RuntimeDefault seccomp profile")
	}
	if s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s: a session's pod must not restart with a fresh state", s.RestartPolicy)
	}
	all := append(slices.Clone(s.InitContainers), s.Containers...)
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: privilege escalation allowed", c.Name)
			continue
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: root filesystem writable", c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", c.Name)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: capabilities not dropped: %+v", c.Name, sc.Capabilities)
		}
	}
	init := s.InitContainers[0].SecurityContext
	if init.RunAsNonRoot == nil || !*init.RunAsNonRoot || len(init.Capabilities.Add) != 0 {
		t.Errorf("install container runs as root or with capabilities: %+v", init)
	}
	main := s.Containers[0]
	wantCaps := []corev1.Capability{"SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"}
	if !slices.Equal(main.SecurityContext.Capabilities.Add, wantCaps) {
		t.Errorf("agent capabilities %v, want exactly %v", main.SecurityContext.Capabilities.Add, wantCaps)
	}
	if main.Command[0] != AgentBinary || main.Image != "example.org/py:3" {
		t.Errorf("the user's image does not run our agent: image %s command %v", main.Image, main.Command)
	}
	for _, m := range main.VolumeMounts {
		if (m.MountPath == AgentDir || m.MountPath == ConfigDir) && !m.ReadOnly {
			t.Errorf("%s is writable by the sandbox", m.MountPath)
		}
	}
	lim := main.Resources.Limits
	if lim.Cpu().MilliValue() != 500 || lim.Memory().Value() != (256+128)<<20 {
		t.Errorf("limits %v, want the declaration's cpu 500m and memory 256Mi + disk 128Mi", lim)
	}
	if req := main.Resources.Requests; req.Memory().Value() != (256+128)<<20 {
		t.Errorf("memory request %v, want the limit", req.Memory())
	}
	if s.RuntimeClassName != nil {
		t.Errorf("runtimeClassName %q for runtime native", *s.RuntimeClassName)
	}
	if s.ActiveDeadlineSeconds != nil {
		t.Error("an idle pool pod has a deadline: its session's lifetime starts at claim")
	}
}

// The sandbox writes only to one memory-backed emptyDir of limits.disk (a tmpfs of that size, so a
// write past it fails with ENOSPC rather than the kubelet evicting the pod afterwards), mounted
// at the workdir and /tmp: together they hold limits.disk, not twice it.
func TestBuildPodDiskIsOneTmpfsOfTheDisk(t *testing.T) {
	p, d := buildTestPod(t, func(d *spec.Sandbox) { d.Workdir = "/w"; d.Limits.Disk = "16Mi" })
	var scratch *corev1.Volume
	for i, v := range p.Spec.Volumes {
		if v.Name == ScratchVolume {
			scratch = &p.Spec.Volumes[i]
		}
	}
	if scratch == nil || scratch.EmptyDir == nil {
		t.Fatalf("no emptyDir %q in %+v", ScratchVolume, p.Spec.Volumes)
	}
	if scratch.EmptyDir.Medium != corev1.StorageMediumMemory || scratch.EmptyDir.SizeLimit == nil || scratch.EmptyDir.SizeLimit.Value() != 16<<20 {
		t.Errorf("scratch emptyDir %+v, want medium Memory, sizeLimit 16Mi", scratch.EmptyDir)
	}
	var writable []string
	for _, m := range p.Spec.Containers[0].VolumeMounts {
		if m.ReadOnly {
			continue
		}
		writable = append(writable, m.MountPath)
		if m.Name != ScratchVolume {
			t.Errorf("%s is writable on volume %q, not the sized tmpfs", m.MountPath, m.Name)
		}
	}
	if want := []string{d.Workdir, "/tmp"}; !slices.Equal(writable, want) {
		t.Errorf("writable mounts %v, want %v", writable, want)
	}
	if !*p.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem {
		t.Error("root filesystem writable: the disk would be unbounded")
	}
	if _, ok := p.Spec.Containers[0].Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
		t.Error("ephemeral-storage limit set: nothing the sandbox writes is on the node's disk")
	}
}

func TestAgentConfigHoldsPublicKeysOnly(t *testing.T) {
	p, d := buildTestPod(t, func(d *spec.Sandbox) { d.Env = map[string]string{"PATH": "/opt/bin", "A": "b"} })
	var cfg agent.Config
	dec := json.NewDecoder(strings.NewReader(p.Annotations[AnnotationAgentConfig]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	ring, key := testRing(t)
	if cfg.KeyRing != ring {
		t.Errorf("key ring %q, want %q", cfg.KeyRing, ring)
	}
	if strings.Contains(p.Annotations[AnnotationAgentConfig], string(key.Seed())) {
		t.Error("the private key is in the pod")
	}
	if _, err := token.ParseKeyRing([]byte(cfg.KeyRing)); err != nil {
		t.Errorf("key ring does not parse: %v", err)
	}
	if cfg.CodeUID != 1_000_007 || cfg.CodeGID != 1_000_007 || cfg.AllowRootCode || p.Labels[LabelCodeUID] != "1000007" {
		t.Errorf("code runs as %d/%d (allowRootCode %v, label %q), want the allocated 1000007",
			cfg.CodeUID, cfg.CodeGID, cfg.AllowRootCode, p.Labels[LabelCodeUID])
	}
	// The session's limits the agent holds: processes (RLIMIT_NPROC), idle time from the claim.
	if cfg.MaxProcesses != d.Limits.Processes() || cfg.IdleTimeout != time.Duration(d.Session.IdleTimeout())*time.Second || !cfg.IdleFromFirstCall {
		t.Errorf("maxProcesses %d idleTimeout %v idleFromFirstCall %v, want %d, %ds, true",
			cfg.MaxProcesses, cfg.IdleTimeout, cfg.IdleFromFirstCall, d.Limits.Processes(), d.Session.IdleTimeout())
	}
	if cfg.SandboxID != d.ID || cfg.SessionID != "sess1" || cfg.Generation != podGeneration || cfg.Listen != "tcp:0.0.0.0:7070" {
		t.Errorf("identity %q/%q/%d listen %q", cfg.SandboxID, cfg.SessionID, cfg.Generation, cfg.Listen)
	}
	if cfg.Env["PATH"] != "/opt/bin" || cfg.Env["A"] != "b" || cfg.Env["HOME"] != d.Workdir {
		t.Errorf("env %v: the declaration overrides the basics", cfg.Env)
	}
	// The run policy is the builder's (no copy of its defaults here), with the pod's own
	// directories refused.
	want := wire.NewPolicy(wire.PolicyFor{Workdir: d.Workdir, Env: d.Env, Lifetime: time.Duration(d.Session.Lifetime()) * time.Second,
		IdleTimeout: time.Duration(d.Session.IdleTimeout()) * time.Second, RuntimePaths: []string{AgentDir, ConfigDir}})
	if !reflect.DeepEqual(cfg.Policy, want) {
		t.Errorf("policy %+v, want the builder's %+v", cfg.Policy, want)
	}
	if p.Labels[LabelSession] != "sess1" || p.Labels[LabelState] != StateIdle {
		t.Errorf("labels %v", p.Labels)
	}
}

func TestNetworkPolicy(t *testing.T) {
	for _, mode := range []spec.EgressMode{spec.EgressDeny, spec.EgressAllow, spec.EgressOpen} {
		t.Run(string(mode), func(t *testing.T) {
			sb := sbx("box", func(s *v1alpha1.SandboxSpec) { s.Egress.Mode = mode })
			d, err := Accept(sb)
			if err != nil {
				t.Fatal(err)
			}
			np := BuildNetworkPolicy(sb, d, testPodOpts)
			if !slices.Contains(np.Spec.PolicyTypes, "Egress") || !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
				t.Fatalf("policy types %v", np.Spec.PolicyTypes)
			}
			if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != DefaultAgentPort {
				t.Fatalf("ingress %+v, want only the agent port", np.Spec.Ingress)
			}
			switch mode {
			case spec.EgressDeny:
				if len(np.Spec.Egress) != 0 {
					t.Fatalf("deny has egress rules %+v", np.Spec.Egress)
				}
				return
			case spec.EgressOpen:
				// One rule with no peer and no port: every destination, every port, every
				// protocol; nothing excepted.
				if len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].To) != 0 || len(np.Spec.Egress[0].Ports) != 0 {
					t.Fatalf("open: egress %+v, want one rule that matches everything", np.Spec.Egress)
				}
				return
			}
			if len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].To) != 2 || len(np.Spec.Egress[0].Ports) != 0 {
				t.Fatalf("egress %+v", np.Spec.Egress)
			}
			// The local runtime's public internet, one list: documentation, benchmarking,
			// multicast and reserved space is refused too (the test cluster's node lives in
			// TEST-NET-1, which an RFC 1918-only list let a public-only pod reach).
			v4 := np.Spec.Egress[0].To[0].IPBlock
			if v4.CIDR != "0.0.0.0/0" {
				t.Fatalf("v4 block %+v", v4)
			}
			for _, nonPublic := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8",
				"100.64.0.0/10", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4"} {
				if !slices.Contains(v4.Except, nonPublic) {
					t.Errorf("public-only egress reaches %s", nonPublic)
				}
			}
			v6 := np.Spec.Egress[0].To[1].IPBlock
			if v6.CIDR != "2000::/3" || !slices.Contains(v6.Except, "2001:db8::/32") || !slices.Contains(v6.Except, "2002::/16") {
				t.Errorf("v6 block %+v, want global unicast less documentation and 6to4", v6)
			}
		})
	}
}

// TestNetworkPolicyExtraPublic: a lab's fake internet is a peer of its own in public-only
// egress, and nowhere else.
func TestNetworkPolicyExtraPublic(t *testing.T) {
	o := testPodOpts
	o.ExtraPublic = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	for _, mode := range []spec.EgressMode{spec.EgressDeny, spec.EgressAllow, spec.EgressOpen} {
		sb := sbx("box", func(s *v1alpha1.SandboxSpec) { s.Egress.Mode = mode })
		d, err := Accept(sb)
		if err != nil {
			t.Fatal(err)
		}
		np := BuildNetworkPolicy(sb, d, o)
		var cidrs []string
		for _, r := range np.Spec.Egress {
			for _, p := range r.To {
				if p.IPBlock != nil && len(p.IPBlock.Except) == 0 {
					cidrs = append(cidrs, p.IPBlock.CIDR)
				}
			}
		}
		var want []string
		if mode == spec.EgressAllow {
			want = []string{"203.0.113.0/24"}
		}
		if !slices.Equal(cidrs, want) {
			t.Errorf("%s: plain peers %v, want %v", mode, cidrs, want)
		}
	}
}

func TestParseExtraPublic(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", "[]", ""},
		{"203.0.113.0/24", "[203.0.113.0/24]", ""},
		{" 198.51.100.7/24 , 2001:db8:1::/48", "[198.51.100.0/24 2001:db8:1::/48]", ""},
		{"10.0.0.0/8", "", "10.0.0.0/8 is not inside a documentation range"},
		{"203.0.0.0/8", "", "203.0.0.0/8 is not inside a documentation range"},
		{"203.0.113.1", "", `"203.0.113.1" is not a prefix`},
	} {
		got, err := ParseExtraPublic(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseExtraPublic(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("ParseExtraPublic(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

// TestBuildPodAllowDomains: an allowDomains pod carries the egress proxy in its network path,
// and only the init container that sets the nftables holds NET_ADMIN; other modes get neither.
func TestBuildPodAllowDomains(t *testing.T) {
	p, _ := buildTestPod(t, func(s *spec.Sandbox) {
		s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"pypi.org", "*.pythonhosted.org"}}
	})
	containers := map[string]corev1.Container{}
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		containers[c.Name] = c
	}
	init, ok := containers[EgressInitName]
	if !ok || p.Spec.InitContainers[len(p.Spec.InitContainers)-1].Name != EgressInitName {
		t.Fatalf("no init container %s: %+v", EgressInitName, p.Spec.InitContainers)
	}
	if got := init.SecurityContext.Capabilities; !reflect.DeepEqual(got.Add, []corev1.Capability{"NET_ADMIN"}) || !reflect.DeepEqual(got.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s capabilities %+v, want NET_ADMIN only", EgressInitName, got)
	}
	if !slices.Contains(init.Command, "egress-init") || !slices.Contains(init.Command, fmt.Sprint(EgressProxyUID)) {
		t.Errorf("%s command %v", EgressInitName, init.Command)
	}
	side, ok := containers[EgressContainerName]
	if !ok {
		t.Fatalf("no sidecar %s", EgressContainerName)
	}
	sc := side.SecurityContext
	if *sc.RunAsUser != EgressProxyUID || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Add) != 0 || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("sidecar security context %+v, want uid %d with no capability", sc, EgressProxyUID)
	}
	cmd := strings.Join(side.Command, " ")
	if !strings.Contains(cmd, "egress-proxy") || !strings.Contains(cmd, "-domains pypi.org,*.pythonhosted.org") || !strings.Contains(cmd, "-sandbox box") {
		t.Errorf("sidecar command %q", cmd)
	}
	if side.StartupProbe == nil || side.StartupProbe.Exec == nil {
		t.Errorf("sidecar has no startup probe: the pod would be ready before the proxy serves")
	}
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if c.Name != EgressInitName && c.SecurityContext != nil && c.SecurityContext.Capabilities != nil && slices.Contains(c.SecurityContext.Capabilities.Add, "NET_ADMIN") {
			t.Errorf("container %s holds NET_ADMIN", c.Name)
		}
	}

	for _, mode := range []spec.EgressMode{spec.EgressDeny, spec.EgressAllow, spec.EgressOpen} {
		p, _ := buildTestPod(t, func(s *spec.Sandbox) { s.Egress = spec.Egress{Mode: mode} })
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			if c.Name == EgressInitName || c.Name == EgressContainerName {
				t.Errorf("egress %s: pod has %s", mode, c.Name)
			}
		}
	}
}

// TestEgressProxyUpstream: the operator's -egress-dns and -egress-public reach the sidecar.
func TestEgressProxyUpstream(t *testing.T) {
	sb := sbx("box", func(s *v1alpha1.SandboxSpec) {
		s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.test"}}
	})
	d, err := Accept(sb)
	if err != nil {
		t.Fatal(err)
	}
	ring, _ := testRing(t)
	o := testPodOpts
	o.EgressDNS = []netip.AddrPort{netip.MustParseAddrPort("203.0.113.90:53")}
	o.ExtraPublic = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	p, err := BuildPod(sb, d, o, ring, "s", "t", 1_000_001)
	if err != nil {
		t.Fatal(err)
	}
	cmd := strings.Join(p.Spec.Containers[len(p.Spec.Containers)-1].Command, " ")
	if !strings.Contains(cmd, "-upstream 203.0.113.90:53") || !strings.Contains(cmd, "-egress-public 203.0.113.0/24") {
		t.Errorf("sidecar command %q", cmd)
	}
}

// TestNetworkPolicyAllowDomains: the proxy may reach the public internet and DNS: the given
// servers only, or port 53 anywhere when the pod's own resolv.conf (cluster DNS) is used.
func TestNetworkPolicyAllowDomains(t *testing.T) {
	sb := sbx("box", func(s *v1alpha1.SandboxSpec) {
		s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.test"}}
	})
	d, err := Accept(sb)
	if err != nil {
		t.Fatal(err)
	}
	np := BuildNetworkPolicy(sb, d, testPodOpts)
	if len(np.Spec.Egress) != 2 || np.Spec.Egress[0].To[0].IPBlock.CIDR != "0.0.0.0/0" || len(np.Spec.Egress[0].Ports) != 0 {
		t.Fatalf("egress %+v, want the public internet and DNS", np.Spec.Egress)
	}
	dns := np.Spec.Egress[1]
	if len(dns.To) != 0 || len(dns.Ports) != 2 || dns.Ports[0].Port.IntValue() != 53 || *dns.Ports[0].Protocol != corev1.ProtocolUDP || *dns.Ports[1].Protocol != corev1.ProtocolTCP {
		t.Errorf("DNS rule %+v, want port 53 UDP and TCP to any address", dns)
	}
	o := testPodOpts
	o.EgressDNS = []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53")}
	dns = BuildNetworkPolicy(sb, d, o).Spec.Egress[1]
	if len(dns.To) != 1 || dns.To[0].IPBlock.CIDR != "10.96.0.10/32" || len(dns.Ports) != 2 {
		t.Errorf("DNS rule %+v, want 10.96.0.10/32 port 53", dns)
	}
}
