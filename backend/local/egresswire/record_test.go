package egresswire

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	"github.com/airlock-sandbox/airlock/spec"
)

// TestUpdateRecord: without a record fn gets nil unless asked to create one; what fn writes is
// what ReadRecord then reads; fn declining to write leaves the file as it was.
func TestUpdateRecord(t *testing.T) {
	dir := t.TempDir()
	if err := UpdateRecord(dir, false, func(r *Record) (bool, error) {
		if r != nil {
			t.Errorf("no record yet, fn got %+v", r)
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRecord(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadRecord before any: %v, want not exist", err)
	}
	want := Record{Egress: spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.example.com"}}, Owner: Self()}
	if err := UpdateRecord(dir, true, func(r *Record) (bool, error) { *r = want; return true, nil }); err != nil {
		t.Fatal(err)
	}
	if err := UpdateRecord(dir, false, func(r *Record) (bool, error) {
		r.Owner.PID = 1 // not written back
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Egress.Mode != want.Egress.Mode || len(got.Egress.Domains) != 1 || got.Owner != want.Owner {
		t.Errorf("read %+v, want %+v", got, want)
	}
	if got.Owner.LiveElsewhere() {
		t.Error("this process counts as a live owner elsewhere")
	}
	if err := os.WriteFile(dir+"/"+File, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRecord(dir); err == nil {
		t.Error("a torn record was read without an error")
	}
}
