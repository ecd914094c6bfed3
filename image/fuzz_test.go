package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// scriptLayers turns a small text script into layer tars, so the fuzzer mutates meaningful
// operations rather than tar framing. One op per line, fields separated by spaces:
//
//	f NAME [BODY]   regular file          s NAME          setuid file
//	d NAME          directory             l NAME TARGET   symlink
//	h NAME TARGET   hard link             c NAME          character device
//	-               start the next layer
//
// "$OUT" anywhere expands to the directory beside the root that must stay untouched.
func scriptLayers(script, out string) [][]byte {
	var layers [][]byte
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	flush := func() {
		tw.Close()
		layers = append(layers, bytes.Clone(buf.Bytes()))
		buf.Reset()
		tw = tar.NewWriter(&buf)
	}
	for _, line := range strings.Split(strings.ReplaceAll(script, "$OUT", out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if fields[0] == "-" {
			flush()
			continue
		}
		if len(fields) < 2 {
			continue
		}
		arg := ""
		if len(fields) > 2 {
			arg = fields[2]
		}
		h := &tar.Header{Name: fields[1], Mode: 0o644, Uid: len(fields[1]) % 3, Format: tar.FormatPAX}
		switch fields[0] {
		case "f":
			h.Typeflag, h.Size = tar.TypeReg, int64(len(arg))
		case "s":
			h.Typeflag, h.Mode = tar.TypeReg, 0o6755
			arg = ""
		case "d":
			h.Typeflag, h.Mode = tar.TypeDir, 0o555
		case "l":
			h.Typeflag, h.Linkname = tar.TypeSymlink, arg
		case "h":
			h.Typeflag, h.Linkname = tar.TypeLink, arg
		case "c":
			h.Typeflag = tar.TypeChar
		default:
			continue
		}
		if tw.WriteHeader(h) != nil {
			continue // names the tar writer cannot encode are not interesting
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(arg))
		}
	}
	flush()
	return layers
}

var fuzzSeeds = []string{
	"f a hello\nd dir\nf dir/x 1\nl link dir/x\nh hl dir/x",
	"f ../x evil",
	"f a/../../x evil",
	"f /abs evil",
	"f $OUT/sentinel evil",
	"l a $OUT\nf a/sentinel evil",
	"l a $OUT\n-\nf a/sentinel evil",
	"l a ../../../../../../../../..$OUT\nf a/sentinel evil",
	"l a $OUT\nd a/new",
	"l a $OUT\nl a/l x",
	"l a $OUT\n-\nf a/.wh.sentinel",
	"l a $OUT\n-\nf a/.wh..wh..opq",
	"h hl $OUT/sentinel",
	"l a $OUT\nh hl a/sentinel",
	"h hl ../sentinel",
	"d d\nf d/a 1\n-\nf d/.wh..wh..opq\nf d/b 2",
	"f x 1\n-\nf .wh.x\n-\nd x\nf x/y 2",
	"l lib usr/lib\nd usr\nd usr/lib\n-\nf lib/x 1",
	"l a .\nl a/a/a/a/b $OUT\nf a/a/b/sentinel evil",
	"l loop loop\nf loop/x 1",
	"s suid\nc dev\nf .wh.. x",
	"f . x\nd .\nl . $OUT",
}

// FuzzExtract: whatever the layers hold, nothing outside the extraction root changes, and the
// result holds no setuid/setgid file and no device node.
func FuzzExtract(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script string) {
		parent := t.TempDir()
		out := filepath.Join(parent, "out")
		root := filepath.Join(parent, "root")
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		sentinel := filepath.Join(out, "sentinel")
		if err := os.WriteFile(sentinel, []byte("s"), 0o644); err != nil {
			t.Fatal(err)
		}
		x, err := newExtractor(root, extractOptions{chown: os.Geteuid() == 0, idBase: 100000, idCount: 65536})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range scriptLayers(script, out) {
			if x.applyLayer(context.Background(), bytes.NewReader(l)) != nil {
				break // refusals are fine; what matters is what got written
			}
		}
		x.finalize()
		x.close()

		ents, _ := os.ReadDir(parent)
		if len(ents) != 2 {
			t.Fatalf("parent of the root now holds %v", ents)
		}
		ents, _ = os.ReadDir(out)
		if len(ents) != 1 {
			t.Fatalf("outside dir now holds %v", ents)
		}
		if fi, err := os.Lstat(sentinel); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
			t.Fatalf("sentinel changed: %v, %v", fi, err)
		}
		if b, _ := os.ReadFile(sentinel); string(b) != "s" {
			t.Fatalf("sentinel content now %q", b)
		}
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeDevice|fs.ModeCharDevice) != 0 {
				t.Errorf("%s has mode %v", p, fi.Mode())
			}
			return nil
		})
	})
}
