// Command airlock-operator runs the Sandbox pool controller and the session broker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/airlock-sandbox/airlock/operator"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/operator/brokerapi"
)

const usage = `usage:
  airlock-operator run [flags]            run the pool controller and the broker (see -h)
  airlock-operator install-agent SRC DST  copy the agent binary (the sandbox pods' init container)
  airlock-operator egress-init [flags]    set a sandbox pod's nftables for allowDomains (its init container)
  airlock-operator egress-proxy [flags]   a sandbox pod's egress resolver and proxy (its sidecar)
  airlock-operator egress-ready [flags]   the sidecar's startup probe
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run":
		if err := run(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "airlock-operator:", err)
			os.Exit(1)
		}
	case "install-agent":
		if len(os.Args) != 4 {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		if err := installAgent(os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, "airlock-operator install-agent:", err)
			os.Exit(1)
		}
	case "egress-init", "egress-proxy", "egress-ready":
		cmd := map[string]func([]string) error{"egress-init": egressInit, "egress-proxy": egressProxy, "egress-ready": egressReady}[os.Args[1]]
		if err := cmd(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "airlock-operator %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
}

// installAgent copies src to dst (0755) through a temporary file, so a half-copied agent never
// runs.
func installAgent(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".agent-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var (
		namespace    = fs.String("namespace", os.Getenv("POD_NAMESPACE"), "the operator's namespace: master Secret, broker pods (default $POD_NAMESPACE)")
		image        = fs.String("airlock-image", "", "image holding /airlock-agent and /airlock-operator (required)")
		pullPolicy   = fs.String("image-pull-policy", "IfNotPresent", "pull policy of sandbox pods: Always, IfNotPresent or Never")
		agentPort    = fs.Int("agent-port", operator.DefaultAgentPort, "agent port in sandbox pods")
		secret       = fs.String("master-secret", "airlock-master", "Secret (in -namespace) whose key \"master\" derives the signing keys")
		brokerAddr   = fs.String("broker-addr", ":8080", "broker listen address")
		tlsCert      = fs.String("tls-cert", "", "broker TLS certificate (PEM); with -tls-key the broker serves HTTPS")
		tlsKey       = fs.String("tls-key", "", "broker TLS key (PEM)")
		healthAddr   = fs.String("health-addr", ":8081", "liveness/readiness probe address")
		audience     = fs.String("audience", brokerapi.DefaultAudience, "audience callers' ServiceAccount tokens must carry")
		gvisorClass  = fs.String("gvisor-runtime-class", "gvisor", "RuntimeClass for runtime: gvisor")
		brokerLabels = fs.String("broker-labels", "app.kubernetes.io/name=airlock-operator", "labels of the broker pods (NetworkPolicy ingress source)")
		tokenTTL     = fs.Duration("token-ttl", time.Hour, "longest life of a capability token (the session's end caps it too)")
		reviewTTL    = fs.Duration("review-cache-ttl", 10*time.Second, "how long a successful TokenReview/SubjectAccessReview is reused (0: never)")
		kubeconfig   = fs.String("kubeconfig", "", "kubeconfig (default: in-cluster, then $KUBECONFIG)")
		leaderElect  = fs.Bool("leader-elect", false, "run the pool controller on the elected replica only (a Lease in -namespace); the broker serves on every replica")
		drainTimeout = fs.Duration("drain-timeout", 20*time.Second, "on SIGTERM, how long the broker lets claims in flight finish (keep it below the pod's terminationGracePeriodSeconds)")
		egressDNS    = fs.String("egress-dns", "", "DNS servers (ip:port, comma-separated) the egress proxy of allowDomains pods asks (default: the pod's own /etc/resolv.conf, i.e. the cluster DNS)")
		egressPublic = fs.String("egress-public", "", "documentation prefixes (TEST-NET, comma-separated) that public-only egress may reach: a lab's fake internet, never real space")
		uidRange     = fs.String("code-uid-range", fmt.Sprintf("%d-%d", operator.DefaultCodeUIDFirst, operator.DefaultCodeUIDLast),
			"uids code runs as, one per sandbox pod (the process limit counts per uid per node): use a range nothing else on the nodes runs as")
		brokerShard = fs.String("broker-shard", "0/1", "i/n: this broker replica hands out first the idle pods whose name hashes to shard i of n (give replicas distinct i), others only when its shard is empty; ordinal/n takes i from the StatefulSet ordinal ending $POD_NAME")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *namespace == "" {
		return errors.New("-namespace is empty (and $POD_NAMESPACE is unset)")
	}
	if *image == "" {
		return errors.New("-airlock-image is required")
	}
	pp := corev1.PullPolicy(*pullPolicy)
	if pp != corev1.PullAlways && pp != corev1.PullIfNotPresent && pp != corev1.PullNever {
		return fmt.Errorf("-image-pull-policy %q: allowed are Always, IfNotPresent, Never", *pullPolicy)
	}
	if *agentPort < 1 || *agentPort > 65535 {
		return fmt.Errorf("-agent-port %d: allowed is 1..65535", *agentPort)
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return errors.New("-tls-cert and -tls-key go together")
	}
	uidFirst, uidLast, err := operator.ParseUIDRange(*uidRange)
	if err != nil {
		return fmt.Errorf("-code-uid-range: %w", err)
	}
	extraPublic, err := operator.ParseExtraPublic(*egressPublic)
	if err != nil {
		return fmt.Errorf("-egress-public: %w", err)
	}
	shard, shards, err := operator.ParseShard(*brokerShard, os.Getenv("POD_NAME"))
	if err != nil {
		return fmt.Errorf("-broker-shard: %w", err)
	}
	egressUpstream, err := parseUpstream(*egressDNS)
	if err != nil {
		return fmt.Errorf("-egress-dns: %w", err)
	}
	sel, err := labels.ConvertSelectorToLabelsMap(*brokerLabels)
	if err != nil || len(sel) == 0 {
		return fmt.Errorf("-broker-labels %q: want k=v[,k=v]", *brokerLabels)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	log.SetLogger(toLogr(logger))

	if *kubeconfig != "" {
		os.Setenv("KUBECONFIG", *kubeconfig)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	managed := labels.SelectorFromSet(labels.Set{operator.LabelManagedBy: operator.ManagedBy})
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "airlock-operator",
		LeaderElectionNamespace: *namespace,
		// A stopping leader hands over at once instead of leaving the pool unattended for the
		// lease duration.
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        *healthAddr,
		// Only our own pods and policies are cached, not every pod of the cluster.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:                 {Label: managed},
			&networkingv1.NetworkPolicy{}: {Label: managed},
		}},
	})
	if err != nil {
		return err
	}
	keys := &operator.Keys{Reader: mgr.GetAPIReader(), Namespace: *namespace, Secret: *secret, TTL: 30 * time.Second}
	pods := operator.PodOptions{
		AirlockImage: *image, PullPolicy: pp, AgentPort: int32(*agentPort),
		OperatorNS: *namespace, BrokerSelector: sel, GVisorClassName: *gvisorClass, ExtraPublic: extraPublic,
		EgressDNS: egressUpstream,
	}
	uids := &operator.CodeUIDs{Reader: mgr.GetClient(), First: uidFirst, Last: uidLast}
	rec := &operator.PoolReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Keys: keys, Pods: pods, UIDs: uids, Log: logger}
	if err := rec.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", func(*http.Request) error { return nil }); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", func(*http.Request) error { return nil }); err != nil {
		return err
	}
	idle := &operator.IdlePods{Shard: shard, Shards: shards}
	if err := idle.Watch(context.Background(), mgr.GetCache()); err != nil {
		return err
	}
	var reviewer operator.Reviewer = &operator.KubeReviewer{Client: mgr.GetClient(), Audience: *audience}
	if *reviewTTL > 0 {
		reviewer = &operator.CachingReviewer{Next: reviewer, TTL: *reviewTTL}
	}
	broker := &operator.Broker{
		Client: mgr.GetClient(), Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Idle: idle,
		Reviewer: reviewer,
		Keys:     keys, AgentPort: int32(*agentPort), TokenTTL: *tokenTTL,
		RetryAfter: 2 * time.Second, DeleteTimeout: 60 * time.Second, Log: logger,
		// One connection per claimed pod, never reused: a dial that takes longer than this is a
		// pod not worth handing out.
		FirstCall: operator.AgentFirstCall(&http.Client{Transport: &http.Transport{
			DialContext:       (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
			DisableKeepAlives: true,
		}}),
	}
	bs := &operator.BrokerServer{Broker: broker, DrainTimeout: *drainTimeout, Log: logger}
	if *tlsCert != "" {
		// Read again on every handshake whose files changed: a renewed Secret needs no restart.
		bs.TLS = &operator.CertReloader{CertFile: *tlsCert, KeyFile: *tlsKey, Log: logger}
	}
	ln, err := net.Listen("tcp", *brokerAddr)
	if err != nil {
		return err
	}

	// On SIGTERM the broker drains first (claims in flight finish, on the manager's clients and
	// caches), then the manager stops.
	sigCtx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	defer stopMgr()
	mgrErr := make(chan error, 1)
	go func() { mgrErr <- mgr.Start(mgrCtx) }()
	brokerCtx, stopBroker := context.WithCancel(sigCtx)
	defer stopBroker()
	brokerErr := make(chan error, 1)
	go func() {
		logger.Info("broker listening", "addr", *brokerAddr, "tls", bs.TLS != nil)
		brokerErr <- bs.Serve(brokerCtx, ln)
	}()
	var first error
	select {
	case first = <-mgrErr: // the manager failed (or lost its lease): the broker drains and we exit
		stopBroker()
		if err := <-brokerErr; first == nil {
			first = err
		}
	case first = <-brokerErr:
		stopMgr()
		<-mgrErr
	}
	stopMgr()
	return failure(first)
}

// failure is the error the operator exits with, given the first of its manager's and broker's:
// nil when that is the cancellation a signal started (they wrap context.Canceled).
func failure(first error) error {
	if errors.Is(first, context.Canceled) {
		return nil
	}
	return first
}
