package operator

import (
	"context"
	"crypto/ed25519"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/token"
)

// MasterSecretKey is the data key of the master Secret (at least token.MinMasterSize bytes).
const MasterSecretKey = "master"

// Keys derives per-sandbox signing keys from the master Secret. Only the operator's process
// holds private keys; pods receive the public key ring of their own sandbox.
type Keys struct {
	Reader    client.Reader
	Namespace string
	Secret    string
}

// keyScope names a sandbox for key derivation: namespace and name, so a same-named Sandbox in
// another namespace has another key.
func keyScope(namespace, name string) string { return namespace + "/" + name }

// Private returns the signing key of Sandbox namespace/name.
func (k *Keys) Private(ctx context.Context, namespace, name string) (ed25519.PrivateKey, error) {
	var s corev1.Secret
	if err := k.Reader.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: k.Secret}, &s); err != nil {
		return nil, fmt.Errorf("%w: master Secret %s/%s: %v", sandbox.ErrUnsupported, k.Namespace, k.Secret, err)
	}
	master := s.Data[MasterSecretKey]
	key, err := token.DeriveKey(master, keyScope(namespace, name))
	if err != nil {
		return nil, fmt.Errorf("%w: master Secret %s/%s key %q: %v", sandbox.ErrUnsupported, k.Namespace, k.Secret, MasterSecretKey, err)
	}
	return key, nil
}

// Ring returns the public key ring text (token.KeyRing form) of Sandbox namespace/name.
func (k *Keys) Ring(ctx context.Context, namespace, name string) (string, error) {
	key, err := k.Private(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	b, err := token.NewKeyRing(key.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		return "", err
	}
	return string(b), nil
}
