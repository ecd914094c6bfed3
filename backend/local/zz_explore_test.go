package local

import (
	"context"
	"testing"
)

func TestExplore(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("explore"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := b.Connect(ctx, s.ID)
	defer a.Close()
	out, errs, res := run(t, a, `grep -E 'Seccomp|NoNewPrivs|Cap' /proc/self/status; cat /proc/self/cgroup; ls /proc; unshare -U true; echo unshare=$?; touch /usr/x; echo touch=$?; echo hi > /workspace/f && echo ok; ls -la /tmp /dev /dev/pts; cat /proc/1/status | head -3; kill -9 1; echo kill=$?; ip addr 2>&1 || cat /proc/net/dev; hostname; cat /etc/resolv.conf; df -h /tmp /workspace; ls /sys/fs/cgroup; python3 -c 'import os; print(os.cpu_count())'`)
	t.Logf("out:\n%s\nerr:\n%s\nres: %+v", out, errs, res)
	t.Logf("log: %s", b.logTail(s.ID))
}
