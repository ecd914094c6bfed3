package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	sigsjson "sigs.k8s.io/json"

	"github.com/airlock-sandbox/airlock/spec/imagearg"
)

// ImageKind names which source an Image uses.
type ImageKind string

const (
	ImageHost      ImageKind = "host"
	ImageRef       ImageKind = "ref"
	ImageOCILayout ImageKind = "ociLayout"
	ImageTarball   ImageKind = "tarball"
	ImageDir       ImageKind = "dir"
	ImageSnapshot  ImageKind = "snapshot"
)

// Prefixes that mark a bare image string as an OCI layout directory.
const (
	OCILayoutPrefix      = imagearg.OCILayoutPrefix
	OCILayoutLongPrefix  = imagearg.OCILayoutLongPrefix
	imageHostString      = imagearg.HostString
	imageObjectFieldList = "host, ref, ociLayout, tarball, dir, snapshot"
)

// ImageFromString classifies the bare string form of an image:
//
//	"host"                          → Host
//	"oci:<path>", "oci-layout:<path>" → OCILayout
//	"*.tar", "*.tar.gz", "*.tgz"    → Tarball
//	"./x", "../x", "/x", ".", ".."  → Dir
//	anything else                   → Ref ("python:3.12", "ghcr.io/o/i@sha256:…")
//
// The empty string is the zero Image. A layout prefix with nothing after it is an error.
func ImageFromString(s string) (Image, error) {
	switch k, v := imagearg.Parse(s); k {
	case imagearg.None:
		return Image{}, nil
	case imagearg.Host:
		return Image{Host: true}, nil
	case imagearg.OCILayout:
		if v == "" {
			return Image{}, fmt.Errorf("%w: image %q names no OCI layout directory after the prefix; write \"oci:./layout\"", ErrInvalid, s)
		}
		return Image{OCILayout: v}, nil
	case imagearg.Tarball:
		return Image{Tarball: v}, nil
	case imagearg.Dir:
		return Image{Dir: v}, nil
	default:
		return Image{Ref: v}, nil
	}
}

// Kind is the one source the image uses; "" when none or more than one is set.
func (i Image) Kind() ImageKind {
	kinds := i.kinds()
	if len(kinds) != 1 {
		return ""
	}
	return kinds[0]
}

func (i Image) kinds() []ImageKind {
	var k []ImageKind
	if i.Host {
		k = append(k, ImageHost)
	}
	if i.Ref != "" {
		k = append(k, ImageRef)
	}
	if i.OCILayout != "" {
		k = append(k, ImageOCILayout)
	}
	if i.Tarball != "" {
		k = append(k, ImageTarball)
	}
	if i.Dir != "" {
		k = append(k, ImageDir)
	}
	if i.Snapshot != "" {
		k = append(k, ImageSnapshot)
	}
	return k
}

// String renders the image for messages: each set source as kind=value, comma-separated.
func (i Image) String() string {
	var parts []string
	if i.Host {
		parts = append(parts, "host")
	}
	for _, f := range []struct {
		k ImageKind
		v string
	}{{ImageRef, i.Ref}, {ImageOCILayout, i.OCILayout}, {ImageTarball, i.Tarball}, {ImageDir, i.Dir}, {ImageSnapshot, i.Snapshot}} {
		if f.v != "" {
			parts = append(parts, string(f.k)+"="+f.v)
		}
	}
	return strings.Join(parts, ", ")
}

// imageFields has Image's fields without its methods, for the object form.
type imageFields Image

// MarshalJSON always writes the object form, which is unambiguous.
func (i Image) MarshalJSON() ([]byte, error) { return json.Marshal(imageFields(i)) }

// UnmarshalJSON accepts the bare string form (see ImageFromString) or the object form; unknown
// fields of the object are refused.
func (i *Image) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		img, err := ImageFromString(s)
		if err != nil {
			return err
		}
		*i = img
		return nil
	case len(data) > 0 && data[0] == '{':
		var f imageFields
		strict, err := sigsjson.UnmarshalStrict(data, &f)
		if err != nil {
			return err
		}
		if len(strict) > 0 {
			return fmt.Errorf("%w: image: %v; allowed fields: %s", ErrInvalid, strict[0], imageObjectFieldList)
		}
		*i = Image(f)
		return nil
	}
	return fmt.Errorf("%w: image must be a string or an object with one of %s, got %s", ErrInvalid, imageObjectFieldList, data)
}
