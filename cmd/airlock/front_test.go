package main

import (
	"encoding/json"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestLightImageAsFull: the lean front reads --image (runcli.LightImage) as this CLI does
// (cli.ParseImage) wherever it reads it at all, and names it among the parked sandboxes' aliases as
// this CLI's filler does; everything else it leaves to this CLI.
func TestLightImageAsFull(t *testing.T) {
	for _, s := range []string{"host", "/srv/rootfs", "./rootfs", "../r", ".", "..", "rootfs", "/a/b.tar", "./x.tgz",
		"/x.tar.gz", "oci:/layout", "oci-layout:./l", "python:3.12", "docker.io/library/python", "hostx", "/"} {
		light, ok := runcli.LightImage(s)
		img, err := cli.ParseImage(s)
		if err != nil {
			if ok {
				t.Errorf("%q: the front serves it, this CLI refuses it: %v", s, err)
			}
			continue
		}
		served := img.Kind() == spec.ImageHost || img.Kind() == spec.ImageDir
		if ok != served {
			t.Errorf("%q: front serves %v, want %v (kind %s)", s, ok, served, img.Kind())
			continue
		}
		if !ok {
			continue
		}
		want, _ := json.Marshal(img)
		if light.JSON != string(want) || light.Key != imageKey(img) {
			t.Errorf("%q: front %s %q, this CLI %s %q", s, light.JSON, light.Key, want, imageKey(img))
		}
	}
}

// TestFrontConstants pins runcli's copies of what it cannot import.
func TestFrontConstants(t *testing.T) {
	host := parkedTemplate(spec.Image{Host: true})
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"MaxParked", runcli.MaxParked, local.MaxParked},
		{"ClaimMargin", runcli.ClaimMargin, runcode.ClaimMargin},
		{"the parked sandbox's memory", core.DefaultMemory, string(host.Limits.Memory)},
	} {
		if c.got != c.want {
			t.Errorf("%s: runcli has %v, want %v", c.name, c.got, c.want)
		}
	}
}
