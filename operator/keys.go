package operator

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"sync"
	"time"

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
	// TTL keeps the master secret in memory this long between reads (0: read every time).
	TTL time.Duration

	mu      sync.Mutex
	master  []byte
	fetched time.Time
}

func (k *Keys) readMaster(ctx context.Context) ([]byte, error) {
	k.mu.Lock()
	if k.master != nil && time.Since(k.fetched) < k.TTL {
		m := k.master
		k.mu.Unlock()
		return m, nil
	}
	k.mu.Unlock()
	var s corev1.Secret
	if err := k.Reader.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: k.Secret}, &s); err != nil {
		return nil, fmt.Errorf("%w: master Secret %s/%s: %v", sandbox.ErrUnsupported, k.Namespace, k.Secret, err)
	}
	m := s.Data[MasterSecretKey]
	k.mu.Lock()
	k.master, k.fetched = m, time.Now()
	k.mu.Unlock()
	return m, nil
}

// keyScope names a sandbox for key derivation: namespace and name, so a same-named Sandbox in
// another namespace has another key.
func keyScope(namespace, name string) string { return namespace + "/" + name }

// Private returns the signing key of Sandbox namespace/name.
func (k *Keys) Private(ctx context.Context, namespace, name string) (ed25519.PrivateKey, error) {
	master, err := k.readMaster(ctx)
	if err != nil {
		return nil, err
	}
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
