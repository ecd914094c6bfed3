//go:build cluster

package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// inClusterImage holds this package's cluster test binary (hack/testcluster/images.sh).
var inClusterImage = envOr("AIRLOCK_K8S_INCLUSTER_IMAGE", "airlock.local/incluster:test")

// TestInClusterDiscovery runs TestInPod in a pod of ServiceAccount app: discovery from the
// pod's own mounted ServiceAccount (namespace file, CA, a token for the broker asked from the
// TokenRequest API with the mounted token), the broker by its Service name, then a claim and
// python on the claimed pod. The test cluster has no kube-proxy and no cluster DNS: the pod's
// KUBERNETES_SERVICE_HOST is the API server's node address (as deploy.sh does for the
// operator), and a host alias gives the broker's Service name the broker pod's address, on the
// pod's port (the only stand-ins; the certificate is verified under the Service name).
func TestInClusterDiscovery(t *testing.T) {
	e := newEnv(t)
	d := baseDecl("inpod")
	e.sandboxCR(d, 1, 1)
	// The ServiceAccount may ask for its own broker token (kubectl create token, from inside).
	kubectl(t, "", "-n", e.ns, "create", "role", "self-token", "--verb=create", "--resource=serviceaccounts/token", "--resource-name=app")
	kubectl(t, "", "-n", e.ns, "create", "rolebinding", "self-token", "--role=self-token", "--serviceaccount="+e.ns+":app")
	kubectl(t, "", "-n", e.ns, "create", "configmap", "broker-ca", "--from-file=ca.crt="+brokerCA)
	nodeIP := kubectl(t, "", "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`)
	brokerIP := strings.TrimSuffix(strings.TrimPrefix(e.broker, "https://"), ":8080")
	// The idle pool pod's agent: the pod waits until the Sandbox's policy lets it reach it.
	agentAddr := net.JoinHostPort(kubectl(t, "", "-n", e.ns, "get", "pod", "-l", "airlock.dev/sandbox=inpod,airlock.dev/state=idle",
		"-o", "jsonpath={.items[0].status.podIP}"), "7070")
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		// An application pod reaches a sandbox's agent only with the client label: the Sandbox's
		// NetworkPolicy admits it and the broker, nothing else (enforced on the test cluster).
		"metadata": map[string]any{"name": "incluster", "namespace": e.ns, "labels": map[string]string{"airlock.dev/client": "true"}},
		"spec": map[string]any{
			"serviceAccountName": "app",
			"restartPolicy":      "Never",
			"hostAliases":        []any{map[string]any{"ip": brokerIP, "hostnames": []string{"airlock-broker.airlock-system.svc"}}},
			"containers": []any{map[string]any{
				"name": "t", "image": inClusterImage, "imagePullPolicy": "Never",
				"command": []string{"/kubernetes.test", "-test.run", "^TestInPod$", "-test.v"},
				"env": []any{
					map[string]string{"name": "KUBERNETES_SERVICE_HOST", "value": nodeIP},
					map[string]string{"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
					map[string]string{"name": "AIRLOCK_K8S_IN_POD", "value": "inpod"},
					map[string]string{"name": "AIRLOCK_K8S_IN_POD_BROKER", "value": "airlock-system/airlock-broker:8080"},
					map[string]string{"name": "AIRLOCK_K8S_IN_POD_AGENT", "value": agentAddr},
				},
				"volumeMounts": []any{
					map[string]any{"name": "ca", "mountPath": "/var/run/secrets/airlock", "readOnly": true},
					map[string]any{"name": "tmp", "mountPath": "/tmp"},
				},
			}},
			"volumes": []any{
				map[string]any{"name": "ca", "configMap": map[string]any{"name": "broker-ca"}},
				map[string]any{"name": "tmp", "emptyDir": map[string]any{}},
			},
		},
	}
	js, _ := json.Marshal(pod)
	kubectl(t, string(js), "apply", "-f", "-")
	deadline := time.Now().Add(3 * time.Minute)
	var phase string
	for {
		phase = kubectl(t, "", "-n", e.ns, "get", "pod", "incluster", "-o", "jsonpath={.status.phase}")
		if phase == "Succeeded" || phase == "Failed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("in-cluster pod: phase %q after 3m\n%s", phase, kubectl(t, "", "-n", e.ns, "describe", "pod", "incluster"))
		}
		time.Sleep(time.Second)
	}
	logs := kubectl(t, "", "-n", e.ns, "logs", "incluster")
	if phase != "Succeeded" || !strings.Contains(logs, "--- PASS: TestInPod") {
		t.Fatalf("in-cluster pod %s:\n%s", phase, logs)
	}
	t.Logf("in the pod:\n%s", logs)
}

// TestInPod is the half of TestInClusterDiscovery that runs in the pod (AIRLOCK_K8S_IN_POD
// names the Sandbox); elsewhere it has nothing to run.
func TestInPod(t *testing.T) {
	name := os.Getenv("AIRLOCK_K8S_IN_POD")
	if name == "" {
		t.Skip("runs in the pod TestInClusterDiscovery starts")
	}
	ctx := ctxT(t)
	cfg, how, err := kb.Discover(ctx, kb.Discovery{Broker: os.Getenv("AIRLOCK_K8S_IN_POD_BROKER")})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("discovered: %s", how)
	if !strings.Contains(how, "in-cluster") || !strings.Contains(how, "TokenRequest") {
		t.Fatalf("discovery: %s", how)
	}
	b, err := kb.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The Sandbox's policy admits this pod to the agent port by its label, and the policy
	// controller (kube-router) adds a new pod's address moments after the pod starts:
	// NetworkPolicy is applied asynchronously. Wait until a pool pod's agent port accepts this
	// pod (a TCP connect, no claim), as an application started with its sandbox would retry.
	agentAddr := os.Getenv("AIRLOCK_K8S_IN_POD_AGENT")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", agentAddr, 5*time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool pod's agent %s refused this pod for a minute: %v", agentAddr, err)
		}
	}
	sess, err := b.Create(ctx, baseDecl(name))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var out, errb bytes.Buffer
	res, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", "print(2+2)"}, Timeout: 30 * time.Second}, &out, &errb)
	if err != nil || res.ExitCode != 0 || out.String() != "4\n" {
		t.Fatalf("python: %+v, %v, stdout %q stderr %q", res, err, out.String(), errb.String())
	}
	if err := b.Terminate(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
}
