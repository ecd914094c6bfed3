package cli

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCheckLoopback(t *testing.T) {
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8765", true},
		{"127.0.0.1:0", true},
		{"127.1.2.3:80", true},
		{"[::1]:8765", true},
		{"localhost:8765", true},
		{"0.0.0.0:8765", false},
		{":8765", false},
		{"[::]:8765", false},
		{"192.168.1.10:8765", false},
		{"example.com:80", false},
		{"127.0.0.1", false},
	} {
		err := CheckLoopback(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok=%v", tt.addr, err, tt.ok)
		}
	}
}

func TestParseImage(t *testing.T) {
	wd, _ := os.Getwd()
	tests := []struct {
		in, want string // want: the image's String(), or "error"
	}{
		{"host", "host"},
		{"./rootfs", "dir=" + filepath.Join(wd, "rootfs")},
		{"/srv/rootfs", "dir=/srv/rootfs"},
		{"oci:./layout", "ociLayout=" + filepath.Join(wd, "layout")},
		{"img.tar", "tarball=" + filepath.Join(wd, "img.tar")},
		{"python:3.12", "ref=python:3.12"},
		{"", "error"},
		{"oci:", "error"},
	}
	for _, tt := range tests {
		img, err := ParseImage(tt.in)
		got := "error"
		if err == nil {
			got = img.String()
		}
		if got != tt.want {
			t.Errorf("ParseImage(%q) = %q (%v), want %q", tt.in, got, err, tt.want)
		}
	}
}
