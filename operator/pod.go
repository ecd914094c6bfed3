package operator

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/egress"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/spec"
)

// PodOptions are the cluster-wide settings every sandbox pod is built with.
type PodOptions struct {
	// AirlockImage holds ImageAgentPath and ImageOperatorPath (static binaries).
	AirlockImage    string
	PullPolicy      corev1.PullPolicy
	AgentPort       int32
	OperatorNS      string            // where the broker runs
	BrokerSelector  map[string]string // the broker pods' labels
	GVisorClassName string            // RuntimeClass used for runtime gvisor
	// ExtraPublic are documentation prefixes (TEST-NET) public-only egress may reach: a lab's
	// fake internet, as $AIRLOCK_EGRESS_PUBLIC is for the local runtime. ParseExtraPublic
	// refuses anything else.
	ExtraPublic []netip.Prefix
	// EgressDNS are the DNS servers the egress proxy of an allowDomains pod asks; empty means
	// the pod's own /etc/resolv.conf (the cluster DNS). The NetworkPolicy lets the pod reach
	// them on port 53 (any server when empty).
	EgressDNS []netip.AddrPort
}

// ParseExtraPublic reads a comma-separated list of documentation prefixes (the operator's
// -egress-public): only those may be declared public.
func ParseExtraPublic(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a prefix such as 203.0.113.0/24: %v", f, err)
		}
		if !egress.DocumentationPrefix(p) {
			return nil, fmt.Errorf("%s is not inside a documentation range (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20): only those may be declared public, for a lab's fake internet", p)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Generation of every pool pod: a pod serves one session and is never reused, so its agent's
// generation never has to move.
const podGeneration = 1

// CPU requests are a fraction of the limit (memory requests equal the limit): the limit is what
// is enforced; the request only reserves scheduling room, and a pool of mostly idle pods
// reserving whole cores would leave the node empty.
const cpuRequestDivisor = 10

// agentPolicy is the run policy of a pod's agent. The agent gives code only the policy's
// environment (the image's is not read: the operator never pulls images), and the uid code
// runs as has no name.
func agentPolicy(d spec.Sandbox) wire.Policy {
	return wire.NewPolicy(wire.PolicyFor{
		Workdir: d.Workdir, Env: d.Env,
		Lifetime:     time.Duration(d.Session.Lifetime()) * time.Second,
		IdleTimeout:  time.Duration(d.Session.IdleTimeout()) * time.Second,
		RuntimePaths: []string{AgentDir, ConfigDir},
	})
}

// agentConfig is what the pod's agent serves with: public keys only.
func agentConfig(d spec.Sandbox, sessionID, keyRing string, port int32, codeUID uint32) ([]byte, error) {
	cfg := agent.Config{
		SandboxID:  d.ID,
		SessionID:  sessionID,
		Generation: podGeneration,
		KeyRing:    keyRing,
		Listen:     fmt.Sprintf("tcp:0.0.0.0:%d", port),
		FilesRoot:  "/",
		Workdir:    d.Workdir,
		Policy:     agentPolicy(d),
		CodeUID:    codeUID,
		CodeGID:    codeUID,
		// The agent ends the session after its idle timeout with nothing active; its clock
		// starts at the first authenticated call, which the broker makes as part of the claim
		// (a pool pod waits unclaimed for as long as it takes).
		IdleFromFirstCall: true,
		// RLIMIT_NPROC on the agent, inherited by code: per uid per node, hence codeUID unique.
		MaxProcesses: d.Limits.Processes(),
	}
	return json.Marshal(cfg)
}

// BuildPod returns the pool pod for session sessionID of sb (d is Accept's result), whose code
// runs as codeUID (from CodeUIDs).
func BuildPod(sb *v1alpha1.Sandbox, d spec.Sandbox, o PodOptions, keyRing, sessionID, template string, codeUID uint32) (*corev1.Pod, error) {
	if codeUID == 0 {
		return nil, fmt.Errorf("code uid 0: code never runs as root")
	}
	cfg, err := agentConfig(d, sessionID, keyRing, o.AgentPort, codeUID)
	if err != nil {
		return nil, err
	}
	cpuMilli, err := d.Limits.CPUMillis()
	if err != nil {
		return nil, err
	}
	memBytes, err := d.Limits.MemoryBytes()
	if err != nil {
		return nil, err
	}
	diskBytes, err := d.Limits.DiskBytes()
	if err != nil {
		return nil, err
	}
	cpuReq := max(cpuMilli/cpuRequestDivisor, 1)
	// The sandbox writes only to one memory-backed emptyDir (the workdir and /tmp are subPaths
	// of it) whose tmpfs the kubelet sizes to sizeLimit = limits.disk, so a write past the disk
	// fails with ENOSPC at once; a disk-backed emptyDir's sizeLimit is only an eviction after the
	// fact. tmpfs pages are charged to the writer's memory cgroup, so the container's memory is
	// limits.memory + limits.disk: files cannot take the processes' memory, nor a full disk get
	// the agent OOM-killed. No ephemeral-storage is requested: nothing the sandbox writes is on
	// the node's disk (the root filesystem is read-only).
	if diskBytes > math.MaxInt64-memBytes {
		return nil, fmt.Errorf("limits.memory %s + limits.disk %s exceed 8 EiB (Accept refuses it)", d.Limits.Memory, d.Limits.Disk)
	}
	podMem := *resource.NewQuantity(memBytes+diskBytes, resource.BinarySI)
	limits := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(cpuMilli, resource.DecimalSI),
		corev1.ResourceMemory: podMem,
	}
	requests := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(cpuReq, resource.DecimalSI),
		corev1.ResourceMemory: podMem,
	}
	disk := resource.NewQuantity(diskBytes, resource.BinarySI)
	yes, no := true, false
	installUID := int64(InstallUID)
	rootUID := int64(0)
	labels := map[string]string{
		LabelSandbox:   sb.Name,
		LabelSession:   sessionID,
		LabelState:     StateIdle,
		LabelTemplate:  template,
		LabelManagedBy: ManagedBy,
		LabelCodeUID:   fmt.Sprint(codeUID),
	}
	for k, v := range d.Labels {
		if _, ours := labels[k]; !ours {
			labels[k] = v
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: sb.Name + "-",
			Namespace:    sb.Namespace,
			Labels:       labels,
			Annotations: map[string]string{
				AnnotationAgentConfig: string(cfg),
				AnnotationGeneration:  fmt.Sprint(podGeneration),
			},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(sb, v1alpha1.GroupVersion.WithKind(v1alpha1.Kind))},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: ptr(int64(1)),
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: []corev1.Container{{
				Name:            InitContainerName,
				Image:           o.AirlockImage,
				ImagePullPolicy: o.PullPolicy,
				Command:         []string{ImageOperatorPath, "install-agent", ImageAgentPath, AgentBinary},
				VolumeMounts:    []corev1.VolumeMount{{Name: "airlock-bin", MountPath: AgentDir}},
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &installUID,
					RunAsGroup:               &installUID,
					RunAsNonRoot:             &yes,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           d.Image.Ref,
				ImagePullPolicy: o.PullPolicy,
				Command:         []string{AgentBinary, "serve", "--config", ConfigFile},
				WorkingDir:      d.Workdir,
				Ports:           []corev1.ContainerPort{{Name: "agent", ContainerPort: o.AgentPort, Protocol: corev1.ProtocolTCP}},
				Resources:       corev1.ResourceRequirements{Limits: limits, Requests: requests},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "airlock-bin", MountPath: AgentDir, ReadOnly: true},
					{Name: "airlock-config", MountPath: ConfigDir, ReadOnly: true},
					{Name: ScratchVolume, MountPath: d.Workdir, SubPath: "workdir"},
					{Name: ScratchVolume, MountPath: "/tmp", SubPath: "tmp"},
				},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(o.AgentPort)}},
					PeriodSeconds:    1,
					FailureThreshold: 3,
				},
				// The agent runs as uid 0 holding only what it needs to run code as codeUID (setuid,
				// setgid, kill across uids) and to hand files to that uid (chown, dac_override,
				// fowner). Code loses every capability at setuid; no_new_privs stops it regaining any.
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &rootUID,
					RunAsGroup:               &rootUID,
					RunAsNonRoot:             &no,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities: &corev1.Capabilities{
						Drop: []corev1.Capability{"ALL"},
						Add:  []corev1.Capability{"SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"},
					},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "airlock-bin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr(resource.MustParse("64Mi"))}}},
				{Name: "airlock-config", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
					Items: []corev1.DownwardAPIVolumeFile{{
						Path:     "config.json",
						FieldRef: &corev1.ObjectFieldSelector{FieldPath: fmt.Sprintf("metadata.annotations['%s']", AnnotationAgentConfig)},
					}},
				}}},
				{Name: ScratchVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: disk}}},
			},
		},
	}
	if d.Runtime == spec.RuntimeGVisor {
		pod.Spec.RuntimeClassName = ptr(o.GVisorClassName)
	}
	if d.Egress.Mode == spec.EgressAllowDomains {
		addEgressProxy(pod, d, o)
	}
	return pod, nil
}

// addEgressProxy puts airlock's egress resolver and proxy (package egress) in the pod's
// network path for allowDomains: an init container holding only NET_ADMIN sets the pod's
// nftables (every TCP connection and DNS query of every uid but the proxy's goes to the proxy
// on loopback; the rest is dropped) and exits, and a sidecar running as EgressProxyUID with
// no capability serves. The sandbox container never holds NET_ADMIN, and code, which runs as
// its own uid, cannot leave the redirect. The pod is ready only once the proxy serves.
func addEgressProxy(pod *corev1.Pod, d spec.Sandbox, o PodOptions) {
	yes, no := true, false
	rootUID, proxyUID := int64(0), int64(EgressProxyUID)
	ports := []string{"-proxy-port", fmt.Sprint(EgressProxyPort), "-dns-port", fmt.Sprint(EgressDNSPort)}
	small := corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{
		Name:            EgressInitName,
		Image:           o.AirlockImage,
		ImagePullPolicy: o.PullPolicy,
		Command:         append([]string{ImageOperatorPath, "egress-init", "-proxy-uid", fmt.Sprint(EgressProxyUID)}, ports...),
		Resources:       small,
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &rootUID,
			RunAsGroup:               &rootUID,
			RunAsNonRoot:             &no,
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}},
		},
	})
	args := append([]string{ImageOperatorPath, "egress-proxy", "-sandbox", d.ID, "-domains", strings.Join(d.Egress.Domains, ",")}, ports...)
	if len(o.EgressDNS) > 0 {
		ups := make([]string, len(o.EgressDNS))
		for i, u := range o.EgressDNS {
			ups[i] = u.String()
		}
		args = append(args, "-upstream", strings.Join(ups, ","))
	}
	if len(o.ExtraPublic) > 0 {
		ps := make([]string, len(o.ExtraPublic))
		for i, p := range o.ExtraPublic {
			ps[i] = p.String()
		}
		args = append(args, "-egress-public", strings.Join(ps, ","))
	}
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
		Name:            EgressContainerName,
		Image:           o.AirlockImage,
		ImagePullPolicy: o.PullPolicy,
		Command:         args,
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
		// A startup probe only: the container is ready once it passes, and nothing polls after.
		StartupProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{ImageOperatorPath, "egress-ready", "-dns-port", fmt.Sprint(EgressDNSPort)}}},
			PeriodSeconds:    1,
			FailureThreshold: 60,
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &proxyUID,
			RunAsGroup:               &proxyUID,
			RunAsNonRoot:             &yes,
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	})
}

func ptr[T any](v T) *T { return &v }

// publicPeers are the NetworkPolicy peers of public-only egress: the public internet exactly as
// the local runtime's egress gateway judges it (egress.IsPublic's ranges, one list), and the
// documentation prefixes a test declared public (PodOptions.ExtraPublic) as peers of their own.
func publicPeers(extra []netip.Prefix) []networkingv1.NetworkPolicyPeer {
	v4, global6, v6 := egress.NonPublicPrefixes()
	except := func(ps []netip.Prefix) []string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.String()
		}
		return out
	}
	peers := []networkingv1.NetworkPolicyPeer{
		{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: except(v4)}},
		{IPBlock: &networkingv1.IPBlock{CIDR: global6.String(), Except: except(v6)}},
	}
	for _, p := range extra {
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.Masked().String()}})
	}
	return peers
}

// BuildNetworkPolicy returns the policy for sb's pods: ingress only to the agent port and only
// from the broker and from pods labelled airlock.dev/client=true in the sandbox's namespace;
// egress none (deny), the public internet only (allow), or everything (open: one empty rule,
// which matches every destination and port, so that the sandbox's own policy grants it
// as allow's rule grants the public internet).
func BuildNetworkPolicy(sb *v1alpha1.Sandbox, d spec.Sandbox, o PodOptions) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(o.AgentPort)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "airlock-" + sb.Name,
			Namespace:       sb.Namespace,
			Labels:          map[string]string{LabelSandbox: sb.Name, LabelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(sb, v1alpha1.GroupVersion.WithKind(v1alpha1.Kind))},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelSandbox: sb.Name, LabelManagedBy: ManagedBy}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				From: []networkingv1.NetworkPolicyPeer{
					{
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": o.OperatorNS}},
						PodSelector:       &metav1.LabelSelector{MatchLabels: o.BrokerSelector},
					},
					{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelClient: "true"}}},
				},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{}, // deny: no rule allows anything
		},
	}
	switch d.Egress.Mode {
	case spec.EgressAllow:
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: publicPeers(o.ExtraPublic)}}
	case spec.EgressOpen:
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
	case spec.EgressAllowDomains:
		// The pod's nftables send code's traffic to the proxy (addEgressProxy); the policy
		// bounds what the proxy itself may reach: the public internet, and DNS for its
		// resolver (the servers of PodOptions.EgressDNS, or any when the cluster DNS is used).
		udp := corev1.ProtocolUDP
		dns := intstr.FromInt32(53)
		dnsRule := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}}
		if len(o.EgressDNS) > 0 {
			dnsRule.Ports = nil
			for _, u := range o.EgressDNS {
				p := intstr.FromInt32(int32(u.Port()))
				dnsRule.Ports = append(dnsRule.Ports, networkingv1.NetworkPolicyPort{Protocol: &udp, Port: &p}, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &p})
				dnsRule.To = append(dnsRule.To, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(u.Addr(), u.Addr().BitLen()).String()}})
			}
		}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: publicPeers(o.ExtraPublic)}, dnsRule}
	}
	return np
}
