package main

import (
	"encoding/json"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestLightImageAsFull: the lean front reads --image (runcli.LightImage) as this CLI does
// (cli.ParseImage) wherever it reads it at all, hands it to the filler so that the filler reads
// what this CLI would, and names it among the spares' aliases as this CLI's filler does; everything else it leaves to this CLI.
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
		// The filler reads the front's --image-json as it reads this CLI's.
		var filler spec.Image
		if err := json.Unmarshal([]byte(light.JSON), &filler); err != nil || filler != img || light.Key != imageKey(img) {
			t.Errorf("%q: front %s (the filler reads %v, %v) %q, this CLI %v %q", s, light.JSON, filler, err, light.Key, img, imageKey(img))
		}
	}
}
