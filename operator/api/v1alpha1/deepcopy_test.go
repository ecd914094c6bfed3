package v1alpha1

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fill sets every field reachable from v to a non-zero value (maps and slices get one element).
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	}
}

// shared reports a path where a and b share memory (pointer, map or slice backing array).
func shared(a, b reflect.Value, path string) string {
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() {
			return ""
		}
		if a.Pointer() == b.Pointer() {
			return path
		}
		return shared(a.Elem(), b.Elem(), path)
	case reflect.Map, reflect.Slice:
		if a.Len() > 0 && a.Pointer() == b.Pointer() {
			return path
		}
		if a.Kind() == reflect.Slice {
			for i := range a.Len() {
				if p := shared(a.Index(i), b.Index(i), path+"[]"); p != "" {
					return p
				}
			}
		}
	case reflect.Struct:
		for i := range a.NumField() {
			if a.Type().Field(i).IsExported() {
				if p := shared(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); p != "" {
					return p
				}
			}
		}
	}
	return ""
}

// TestDeepCopyIsDeep fails when a field (e.g. one added to spec.Sandbox) is copied shallowly.
func TestDeepCopyIsDeep(t *testing.T) {
	var in Sandbox
	fill(reflect.ValueOf(&in.Spec).Elem())
	in.Status.Conditions = []metav1.Condition{{Type: "Ready"}}
	in.Labels = map[string]string{"a": "b"}
	out := in.DeepCopy()
	if !reflect.DeepEqual(&in, out) {
		t.Fatal("copy differs from the original")
	}
	if p := shared(reflect.ValueOf(&in).Elem(), reflect.ValueOf(out).Elem(), "Sandbox"); p != "" {
		t.Fatalf("%s is shared between the original and the copy", p)
	}
}
