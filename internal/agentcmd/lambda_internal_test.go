package agentcmd

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/wire"
)

// TestLambdaConfigPolicy: a MicroVM's agent gets its run policy from wire.NewPolicy, made from
// the payload's declared env and lifetime and the image's environment (this process's PATH,
// LANG, LC_ALL), not from a copy of the defaults.
func TestLambdaConfigPolicy(t *testing.T) {
	t.Setenv("PATH", "/image/bin")
	t.Setenv("LANG", "image-lang")
	t.Setenv("NOT_IMAGE", "x")
	workdir := t.TempDir()
	payload, err := json.Marshal(agent.Config{SandboxID: "s", SessionID: "m", Workdir: workdir,
		Policy: wire.Policy{Env: map[string]string{"LANG": "decl-lang", "D": "1"}, MaxTimeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := lambdaConfig(payload, "tcp:127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	want := wire.NewPolicy(wire.PolicyFor{Workdir: workdir, User: "sandbox", ImageEnv: []string{"PATH=/image/bin", "LANG=image-lang"},
		Env: map[string]string{"LANG": "decl-lang", "D": "1"}, Lifetime: time.Hour})
	if !reflect.DeepEqual(cfg.Policy, want) {
		t.Errorf("policy %+v, want the builder's %+v", cfg.Policy, want)
	}
	if cfg.Env["PATH"] != "/image/bin" || cfg.Env["LANG"] != "decl-lang" || cfg.Env["NOT_IMAGE"] != "" {
		t.Errorf("env %v: the image's PATH under the declaration's LANG, nothing else of this process", cfg.Env)
	}
}
