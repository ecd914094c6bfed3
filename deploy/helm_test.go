package deploy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/operator"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
)

const (
	chartDir   = "deploy/helm/airlock"
	goldenDir  = "deploy/testdata/helm"
	baseDir    = "deploy/base"
	baseFile   = "airlock.yaml"
	releaseNS  = "airlock-system"
	helmPkg    = "helm.sh/helm/v4/cmd/helm"
	release    = "airlock"
	kustomizeF = "kustomization.yaml"
)

// baseValues render the kustomize base from the chart: the namespace object, no Helm labels.
var baseValues = []string{"--set", "namespace.create=true", "--set", "helmLabels=false"}

func helmBin(t *testing.T) string { return tool(t, "helm", helmPkg) }

// ciValues are the chart's example values files (chart-testing's ci/ convention): each is linted
// and rendered to a golden.
func ciValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s/ci/*-values.yaml: %v", chartDir, err)
	}
	return files
}

func TestHelmLint(t *testing.T) {
	helm, root := helmBin(t), repoRoot(t)
	for _, f := range ciValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			out := run(t, root, helm, "lint", "--strict", chartDir, "-f", f, "--namespace", releaseNS)
			if !bytes.Contains(out, []byte("0 chart(s) failed")) {
				t.Fatalf("helm lint: %s", out)
			}
		})
	}
}

func helmTemplate(t *testing.T, args ...string) []byte {
	t.Helper()
	return run(t, repoRoot(t), helmBin(t), append([]string{"template", release, chartDir, "--namespace", releaseNS}, args...)...)
}

// TestHelmTemplateGolden: helm template of each ci values file is its golden
// (deploy/testdata/helm/<name>.yaml; -update rewrites them).
func TestHelmTemplateGolden(t *testing.T) {
	root := repoRoot(t)
	for _, f := range ciValues(t) {
		name := strings.TrimSuffix(filepath.Base(f), "-values.yaml")
		t.Run(name, func(t *testing.T) {
			got := helmTemplate(t, "-f", f)
			golden := filepath.Join(root, goldenDir, name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("helm template -f %s differs from %s; if the change is meant, run go test ./deploy -run TestHelmTemplateGolden -update\n%s",
					filepath.Base(f), golden, firstDiff(string(want), string(got)))
			}
			checkObjects(t, got)
		})
	}
}

// TestKustomizeBaseIsTheChart: deploy/base is the chart rendered with the namespace and without
// Helm labels (CRD included): one source for both installs. -update rewrites it.
func TestKustomizeBaseIsTheChart(t *testing.T) {
	root := repoRoot(t)
	got := helmTemplate(t, append([]string{"--include-crds"}, baseValues...)...)
	got = append([]byte("# Generated from deploy/helm/airlock by go test ./deploy -run TestKustomizeBaseIsTheChart -update; do not edit.\n"), got...)
	path := filepath.Join(root, baseDir, baseFile)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not the rendered chart; run go test ./deploy -run TestKustomizeBaseIsTheChart -update\n%s", path, firstDiff(string(want), string(got)))
	}
	objs := checkObjects(t, got)
	if _, ok := objs["CustomResourceDefinition/sandboxes.airlock.dev"]; !ok {
		t.Errorf("the base has no Sandbox CRD")
	}
	if _, ok := objs["Namespace/"+releaseNS]; !ok {
		t.Errorf("the base has no namespace %s", releaseNS)
	}
	// The kustomization installs exactly the rendered file.
	var k struct {
		Resources []string `json:"resources"`
	}
	b, err := os.ReadFile(filepath.Join(root, baseDir, kustomizeF))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(k.Resources, []string{baseFile}) {
		t.Errorf("%s resources %v, want [%s]", kustomizeF, k.Resources, baseFile)
	}
	entries, _ := os.ReadDir(filepath.Join(root, baseDir))
	for _, e := range entries {
		if e.Name() != baseFile && e.Name() != kustomizeF {
			t.Errorf("%s holds %s: the base is generated from the chart, put it in the chart", baseDir, e.Name())
		}
	}
}

// TestHelmValuesRefused: bad values fail the render with a message naming the value.
func TestHelmValuesRefused(t *testing.T) {
	helm, root := helmBin(t), repoRoot(t)
	tests := []struct {
		name string
		set  []string
		want string
	}{
		{"unknown key", []string{"--set", "replica=3"}, "replica"},
		{"zero replicas", []string{"--set", "replicas=0"}, "replicas"},
		{"bad pull policy", []string{"--set", "sandboxImagePullPolicy=Sometimes"}, "sandboxImagePullPolicy"},
		{"cert-manager without issuer", []string{"--set", "brokerTLS.certManager.enabled=true"}, "issuerRef.name"},
		{"sandbox without spec", []string{"--set", "sandboxes[0].name=py", "--set", "sandboxes[0].namespace=a"}, "spec"},
		{"agent port out of range", []string{"--set", "agentPort=70000"}, "agentPort"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(helm, append([]string{"template", release, chartDir, "--namespace", releaseNS}, tc.set...)...)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("rendered: %s", tc.set)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("error does not name %q: %s", tc.want, out)
			}
		})
	}
}

// TestHelmMasterSecret: masterSecret.create renders a random master of 64 characters (more than
// the 32 bytes the operator needs), kept by Helm on uninstall.
func TestHelmMasterSecret(t *testing.T) {
	out := helmTemplate(t, "--set", "masterSecret.create=true", "--show-only", "templates/master-secret.yaml")
	var s corev1.Secret
	if err := yaml.UnmarshalStrict(out, &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Data["master"]) != 64 || s.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Fatalf("master secret: %d bytes, annotations %v", len(s.Data["master"]), s.Annotations)
	}
	again := helmTemplate(t, "--set", "masterSecret.create=true", "--show-only", "templates/master-secret.yaml")
	if bytes.Equal(out, again) {
		t.Fatalf("two renders made the same master secret")
	}
}

// checkObjects decodes every rendered object strictly into its Kubernetes type (an unknown or
// duplicated field fails), admits each Sandbox through the CRD schema and the operator, and
// checks the operator's flags name what the chart made. It returns the objects by kind/name.
func checkObjects(t *testing.T, rendered []byte) map[string]runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	crd := loadCRD(t)
	objs := map[string]runtime.Object{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(rendered)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		if head.Kind == "" {
			continue // comments only
		}
		key := head.Kind + "/" + head.Metadata.Name
		switch head.APIVersion {
		case "apiextensions.k8s.io/v1", "cert-manager.io/v1":
			// Not in client-go's scheme: parsed for duplicates; the CRD is checked by the TestCRD* tests.
			var m map[string]any
			if err := yaml.UnmarshalStrict(doc, &m); err != nil {
				t.Errorf("%s: %v", key, err)
			}
			objs[key] = nil
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			t.Errorf("%s does not decode strictly: %v", key, err)
			continue
		}
		objs[key] = obj
		if sb, ok := obj.(*v1alpha1.Sandbox); ok {
			m := toMap(t, sb)
			delete(m, "status")
			if _, errs := crd.admit(m); len(errs) > 0 {
				t.Errorf("Sandbox %s refused by the CRD: %v", sb.Name, errs.ToAggregate())
			}
			if _, err := operator.Accept(sb); err != nil {
				t.Errorf("Sandbox %s refused by the operator: %v", sb.Name, err)
			}
		}
	}
	checkOperatorWiring(t, objs)
	return objs
}

// checkOperatorWiring: the flags the StatefulSet passes name the objects the chart made.
func checkOperatorWiring(t *testing.T, objs map[string]runtime.Object) {
	t.Helper()
	d, ok := objs["StatefulSet/airlock-operator"]
	if !ok || d == nil {
		t.Fatalf("no StatefulSet airlock-operator")
	}
	b, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Spec struct {
			Replicas *int32 `json:"replicas"`
			Template struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec corev1.PodSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	args := spec.Spec.Template.Spec.Containers[0].Args
	flag := func(name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		t.Errorf("operator has no --%s", name)
		return ""
	}
	// The NetworkPolicy the operator writes admits the broker pods by these labels.
	for _, kv := range strings.Split(flag("broker-labels"), ",") {
		k, v, _ := strings.Cut(kv, "=")
		if spec.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("--broker-labels %s: the operator pods are labelled %v", kv, spec.Spec.Template.Metadata.Labels)
		}
	}
	if flag("leader-elect") != "true" {
		t.Errorf("--leader-elect is not true: replicas would each run the pool controller")
	}
	var tlsSecret string
	for _, v := range spec.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			tlsSecret = v.Secret.SecretName
		}
	}
	if svc, ok := objs["Service/airlock-broker"].(*corev1.Service); !ok || svc.Spec.Ports[0].Port != 443 {
		t.Errorf("no Service airlock-broker on 443 (the binding's default broker address)")
	}
	if tlsSecret == "" {
		t.Errorf("the operator mounts no TLS Secret")
	}
	if want := []string{"--tls-cert=/etc/airlock/broker-tls/tls.crt", "--tls-key=/etc/airlock/broker-tls/tls.key"}; !slices.Contains(args, want[0]) || !slices.Contains(args, want[1]) {
		t.Errorf("operator args %v lack %v", args, want)
	}
	// Each replica hands out its own shard of the idle pods: the pod's name (its StatefulSet
	// ordinal) picks a distinct one of as many shards as there are replicas.
	c := spec.Spec.Template.Spec.Containers[0]
	hasPodName := false
	for _, e := range c.Env {
		hasPodName = hasPodName || e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}
	if !hasPodName {
		t.Errorf("the operator has no POD_NAME from metadata.name (--broker-shard=%s/n reads it)", operator.ShardOrdinal)
	}
	if spec.Spec.Replicas == nil {
		t.Fatalf("no replicas")
	}
	replicas := int(*spec.Spec.Replicas)
	shardOf := map[uint32]int{}
	for ord := range replicas {
		i, n, err := operator.ParseShard(flag("broker-shard"), fmt.Sprintf("airlock-operator-%d", ord))
		if err != nil || int(n) != replicas {
			t.Errorf("--broker-shard %q for replica %d: shard %d of %d, %v; want one of %d", flag("broker-shard"), ord, i, n, err, replicas)
			continue
		}
		if prev, ok := shardOf[i]; ok {
			t.Errorf("replicas %d and %d both take shard %d", prev, ord, i)
		}
		shardOf[i] = ord
	}
	// The operator accepts every flag the chart passes: it gets past flag parsing to the first
	// thing that needs a cluster (a kubeconfig that does not exist).
	cmd := exec.Command(operatorBin(t), append(append(c.Command[1:], args...), "--kubeconfig=/nonexistent/kubeconfig")...)
	cmd.Env = []string{"POD_NAMESPACE=" + releaseNS, "POD_NAME=airlock-operator-0"}
	out, _ := cmd.CombinedOutput()
	if o := string(out); strings.Contains(o, "flag provided but not defined") || strings.Contains(o, "invalid value") || !strings.Contains(o, "configuration") {
		t.Errorf("airlock-operator %v did not reach the cluster step: %s", args, out)
	}
}

var (
	operatorOnce sync.Once
	operatorPath string
	operatorErr  error
)

// operatorBin builds cmd/airlock-operator once per test run.
func operatorBin(t *testing.T) string {
	t.Helper()
	operatorOnce.Do(func() {
		dir, err := os.MkdirTemp("", "airlock-operator-")
		if err != nil {
			operatorErr = err
			return
		}
		operatorPath = filepath.Join(dir, "airlock-operator")
		cmd := exec.Command("go", "build", "-o", operatorPath, "./cmd/airlock-operator")
		cmd.Dir = repoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			operatorErr = fmt.Errorf("build airlock-operator: %v\n%s", err, out)
		}
	})
	if operatorErr != nil {
		t.Fatal(operatorErr)
	}
	return operatorPath
}

// firstDiff shows the first differing line of two texts.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return "line " + strconv.Itoa(i+1) + ":\n- " + a + "\n+ " + b
		}
	}
	return ""
}
