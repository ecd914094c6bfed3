package image

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func benchImageEnts(n int) []ent {
	ents := make([]ent, 0, n+n/50)
	for i := 0; i < n; i++ {
		if i%50 == 0 {
			ents = append(ents, d(fmt.Sprintf("d%03d", i/50)))
		}
		ents = append(ents, f(fmt.Sprintf("d%03d/f%05d", i/50, i), strings.Repeat("x", 512)))
	}
	return ents
}

// BenchmarkResolveMiss unpacks a 2,000-file image into a fresh cache each iteration.
func BenchmarkResolveMiss(b *testing.B) {
	src := writeLayout(b, imageOfEnts(b, benchImageEnts(2000)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Resolve(context.Background(), src, b.TempDir(), nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResolveHit is the per-sandbox cost once the image is cached.
func BenchmarkResolveHit(b *testing.B) {
	src := writeLayout(b, imageOfEnts(b, benchImageEnts(2000)))
	cache := b.TempDir()
	if _, err := Resolve(context.Background(), src, cache, nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Resolve(context.Background(), src, cache, nil); err != nil {
			b.Fatal(err)
		}
	}
}
