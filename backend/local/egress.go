package local

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/egress"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Egress wiring (docs/egress.md). A sandbox whose egress is deny gets nothing here: its network
// namespace has only loopback, as it always had. Any other mode (allow, allowDomains, open) is attached to the backend's
// egress.Gateway after clone and before init gets its config (init blocks on the config pipe,
// so no code runs before the policy holds), and init binds <session>/run/resolv.conf, naming
// the gateway's resolver, over /etc/resolv.conf.
//
// The gateway's resolver and proxy live in the process that attached the sandbox: there is no
// daemon. egress.json in the session dir records the policy in force and that process (its
// pid and start time). When it dies, the sandbox's link and table stay but nothing answers on
// them (TCP is redirected to a port nobody listens on, UDP is dropped), so the sandbox fails
// closed; the next process that adopts it (a restarted daemon, any CLI call that finds it)
// removes the leftovers and attaches it again with the recorded policy. A sandbox made by a
// one-shot `airlock run` therefore has egress while its creator lives, which is its whole life;
// one made by the daemon, while the daemon lives.

// EgressOptions configure the egress gateway (egress.Options). Upstream defaults to the
// nameservers of the host's /etc/resolv.conf and Logger to the backend's; tests set HostNetns
// to a namespace of their own, which then is the sandboxes' uplink.
type EgressOptions = egress.Options

// egressFile is the session dir's egress record.
const egressFile = "egress.json"

// egressRecord is egress.json: the policy in force and the process whose proxy enforces it.
type egressRecord struct {
	Egress spec.Egress `json:"egress"`
	Owner  egressOwner `json:"owner"`
}

type egressOwner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// egressSelf is this process as an owner.
var egressSelf = sync.OnceValue(func() egressOwner {
	st, _ := startTime(os.Getpid())
	return egressOwner{PID: os.Getpid(), Start: st}
})

// live reports whether the owner is a running process other than this one.
func (o egressOwner) liveElsewhere() bool {
	return o != egressSelf() && alive(o.PID, o.Start)
}

// egressProbe is egress.Probe once per process: the kernel's abilities do not change, and
// the probe builds and drops a network namespace (a few milliseconds).
var egressProbe = sync.OnceValue(egress.Probe)

// egressState is the backend's gateway (made on first use) and the attachments it holds.
type egressState struct {
	mu     sync.Mutex
	gw     *egress.Gateway
	atts   map[string]*egress.Attachment // by session id
	closed bool
	// Totals of attachments already closed, so that EgressCounts only grows.
	closedAllowed, closedDenied uint64
}

// egressCapabilities sets publicOnlyEgress and domainEgressRules from egress.Probe: both need
// a veth pair and nftables (NAT redirect, conntrack, counters) in the host namespace, which is
// what the probe tries in a throwaway namespace of its own.
func egressCapabilities(entries map[capability.Name]capability.Status) {
	st := capability.Status{Supported: true}
	if err := egressProbe(); err != nil {
		st = capability.Status{Reason: strings.TrimPrefix(err.Error(), sandbox.ErrUnsupported.Error()+": ")}
	}
	entries[capability.PublicOnlyEgress] = st
	entries[capability.DomainEgressRules] = st
	entries[capability.LiveEgress] = st // SetEgress: the same gateway, rewired
}

// egressEnforceable tells whether this host can enforce egress needing capability name: the
// published set says so when egress.Probe passed within hostProbeTTL, in this process or
// another on the same state dir (airlock run would otherwise build and drop a throwaway
// network namespace, ~2 ms, on every call with the network on); else this process's own probe
// says why not. A mechanism lost since then fails when the gateway is wired, at create.
func (b *Backend) egressEnforceable(name capability.Name) error {
	return enforceableFrom(b.caps, egressProbe)(name)
}

// enforceableFrom is egressEnforceable over a published set and a probe.
func enforceableFrom(published func() capability.Set, probe func() error) func(capability.Name) error {
	return func(name capability.Name) error {
		if published != nil && published().Entries[name].Supported {
			return nil
		}
		return probe()
	}
}

// checkEgress refuses an egress block the runtime cannot enforce here; enforceable reports
// (as egressEnforceable) whether the capability the mode needs holds.
func checkEgress(e spec.Egress, gvisor bool, enforceable func(capability.Name) error) error {
	p := egress.PolicyFromSpec(e)
	if err := p.Validate(); err != nil {
		return err
	}
	if p.Mode == spec.EgressDeny {
		return nil
	}
	if gvisor {
		return fmt.Errorf("%w: egress mode %q under runtime gvisor: runsc has its own network stack, which the egress gateway is not wired to; use runtime native, or egress deny", sandbox.ErrUnsupported, p.Mode)
	}
	name := capability.PublicOnlyEgress
	if p.Mode == spec.EgressAllowDomains {
		name = capability.DomainEgressRules
	}
	if err := enforceable(name); err != nil {
		if p.Mode == spec.EgressOpen {
			// open restricts nothing, but its path out is the same gateway (veth, nftables
			// redirect to the proxy) that publicOnlyEgress probes.
			return fmt.Errorf("%w: egress mode %q needs the egress gateway (a veth pair and nftables in the host namespace; probed as capability %s), which this host lacks: %v", sandbox.ErrUnsupported, p.Mode, name, err)
		}
		return fmt.Errorf("%w: egress mode %q needs capability %s, which this host lacks: %v", sandbox.ErrUnsupported, p.Mode, name, err)
	}
	return nil
}

// egressGateway returns the backend's gateway, made on first use.
func (b *Backend) egressGateway() (*egress.Gateway, error) {
	b.egress.mu.Lock()
	defer b.egress.mu.Unlock()
	if b.egress.closed {
		return nil, fmt.Errorf("%w: the backend is closed", sandbox.ErrInvalid)
	}
	if b.egress.gw != nil {
		return b.egress.gw, nil
	}
	opts := b.opts.Egress
	if opts.Logger == nil {
		opts.Logger = b.log
	}
	if len(opts.Upstream) == 0 {
		opts.Upstream = hostNameservers("/etc/resolv.conf")
	}
	gw, err := egress.NewGateway(opts)
	if err != nil {
		return nil, err
	}
	b.egress.gw = gw
	if b.egress.atts == nil {
		b.egress.atts = map[string]*egress.Attachment{}
	}
	return gw, nil
}

// hostNameservers reads the nameserver lines of a resolv.conf; unreadable or none: nil.
func hostNameservers(path string) []netip.AddrPort {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseNameservers(f)
}

func parseNameservers(r io.Reader) []netip.AddrPort {
	var out []netip.AddrPort
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil {
			out = append(out, netip.AddrPortFrom(a, 53))
		}
	}
	return out
}

func (b *Backend) attachment(id string) *egress.Attachment {
	b.egress.mu.Lock()
	defer b.egress.mu.Unlock()
	return b.egress.atts[id]
}

// attachEgress runs between clone and the config: it attaches a new sandbox whose egress is
// not deny and puts its resolver into the config.
func (b *Backend) attachEgress(ctx context.Context, s *session, cfg *nsinit.Config) error {
	p := egress.PolicyFromSpec(s.rec.Spec.Egress)
	if p.Mode == spec.EgressDeny {
		return nil
	}
	// Recorded before anything exists, so that a crash from here on leaves a trace to clean.
	if err := withEgressRecord(s.dir, true, func(rec *egressRecord) (bool, error) {
		*rec = egressRecord{Egress: s.rec.Spec.Egress, Owner: egressSelf()}
		return true, nil
	}); err != nil {
		return err
	}
	att, err := b.setupEgress(ctx, s, p)
	if err != nil {
		return err
	}
	cfg.Nameserver = att.Resolver().String()
	return nil
}

// setupEgress attaches s's network namespace with p and keeps the attachment.
func (b *Backend) setupEgress(ctx context.Context, s *session, p egress.Policy) (*egress.Attachment, error) {
	if p.Mode != spec.EgressDeny && len(b.opts.Egress.Upstream) == 0 && len(hostNameservers("/etc/resolv.conf")) == 0 {
		return nil, fmt.Errorf("%w: egress mode %q needs a DNS server for the sandbox's resolver to ask: none in Options.Egress.Upstream or the host's /etc/resolv.conf", sandbox.ErrUnsupported, p.Mode)
	}
	gw, err := b.egressGateway()
	if err != nil {
		return nil, err
	}
	ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", s.rec.InitPID))
	if err != nil {
		return nil, fmt.Errorf("egress: network namespace of init %d: %w", s.rec.InitPID, err)
	}
	defer ns.Close()
	// Checked after opening: the handle is then that very process's namespace.
	if !alive(s.rec.InitPID, s.rec.InitStart) {
		return nil, fmt.Errorf("egress: init %d is gone", s.rec.InitPID)
	}
	att, err := gw.Setup(ctx, s.rec.ID, ns, p)
	if err != nil {
		return nil, err
	}
	b.egress.mu.Lock()
	b.egress.atts[s.rec.ID] = att
	b.egress.mu.Unlock()
	return att, nil
}

// detachEgress removes a sandbox's network as it is destroyed (its init is gone): the
// attachment this process holds, or what a dead owner left. A live owner elsewhere closes its
// own attachment when it sees init exit.
func (b *Backend) detachEgress(ctx context.Context, id, dir string) error {
	b.egress.mu.Lock()
	att := b.egress.atts[id]
	delete(b.egress.atts, id)
	b.egress.mu.Unlock()
	if att != nil {
		return b.closeAttachment(att)
	}
	rec, err := readEgressRecord(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // egress deny from the start: nothing was ever attached
	}
	if err != nil {
		return err
	}
	if rec.Owner == egressSelf() || rec.Owner.liveElsewhere() {
		// Ours but not held: closed with the backend, or its setup failed and undid itself.
		return nil
	}
	gw, err := b.egressGateway()
	if err != nil {
		return err
	}
	return gw.Cleanup(ctx, id)
}

func (b *Backend) closeAttachment(att *egress.Attachment) error {
	c := att.Counters()
	err := att.Close()
	b.egress.mu.Lock()
	b.egress.closedAllowed += c.ConnsAllowed
	b.egress.closedDenied += c.ConnsDenied
	b.egress.mu.Unlock()
	return err
}

// adoptEgress re-attaches an adopted sandbox whose egress owner is dead. A failure leaves the
// sandbox without network (fail closed) and is logged: the sandbox itself is fine.
func (b *Backend) adoptEgress(ctx context.Context, s *session) {
	if err := b.takeOverEgress(ctx, s); err != nil {
		b.log.Warn("egress of an adopted sandbox not re-attached; it has no network until another process takes it over", "session", s.rec.ID, "err", err)
	}
}

func (b *Backend) takeOverEgress(ctx context.Context, s *session) error {
	if b.attachment(s.rec.ID) != nil {
		return nil
	}
	return withEgressRecord(s.dir, false, func(rec *egressRecord) (bool, error) {
		if rec == nil || rec.Owner.liveElsewhere() {
			return false, nil
		}
		gw, err := b.egressGateway()
		if err != nil {
			return false, err
		}
		if err := gw.Cleanup(ctx, s.rec.ID); err != nil {
			return false, err
		}
		p := egress.PolicyFromSpec(rec.Egress)
		rec.Owner = egressSelf()
		if p.Mode == spec.EgressDeny {
			return true, nil // attached again by a later SetEgress that widens it
		}
		att, err := b.setupEgress(ctx, s, p)
		if err != nil {
			return false, err
		}
		b.log.Info("egress re-attached", "session", s.rec.ID, "mode", p.Mode, "resolver", att.Resolver())
		return true, writeResolvConf(s.dir, att.Resolver())
	})
}

// writeResolvConf rewrites the file init bound over /etc/resolv.conf, in place (the bind
// holds the inode).
func writeResolvConf(dir string, resolver netip.Addr) error {
	if err := resolvConfBound(dir); err != nil {
		if !resolver.IsValid() {
			return nil // no resolver to announce, and the sandbox's own file says none
		}
		return err
	}
	// run/ belongs to the sandbox's root: open without following a link it may have put in
	// place of the file (O_NOFOLLOW) or blocking on a FIFO (O_NONBLOCK), and write only into a
	// regular file, truncated after the check rather than by the open.
	f, err := os.OpenFile(filepath.Join(dir, "run", nsinit.ResolvConfFile), os.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the sandbox's resolv.conf: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("the sandbox's resolv.conf is a %v, not a regular file: not written", fi.Mode().Type())
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.Write(nsinit.ResolvConf(resolver))
	return errors.Join(err, f.Close())
}

// resolvConfBound says whether init bound our file over /etc/resolv.conf (it writes the file
// only then).
func resolvConfBound(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "run", nsinit.ResolvConfFile)); err != nil {
		return fmt.Errorf("%w: the sandbox's /etc/resolv.conf could not be covered when it was created (a symlink, or missing in a read-only image /etc), so it cannot be told its resolver", sandbox.ErrUnsupported)
	}
	return nil
}

// SetEgress changes a live sandbox's egress policy: tighter or wider, effective for new
// connections and DNS queries at once (established connections continue, except that a move
// to deny removes the link and so cuts them). Only the process that enforces the sandbox's
// egress can change it; another live one gets ErrConflict.
func (b *Backend) SetEgress(ctx context.Context, sessionID string, e spec.Egress) error {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return err
	}
	if err := checkEgress(e, s.rec.Runtime == string(spec.RuntimeGVisor), b.egressEnforceable); err != nil {
		return err
	}
	p := egress.PolicyFromSpec(e)
	s.mu.Lock() // against destroy
	defer s.mu.Unlock()
	if s.gone || s.exited() {
		return fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, sessionID)
	}
	return withEgressRecord(s.dir, true, func(rec *egressRecord) (bool, error) {
		att := b.attachment(sessionID)
		if att == nil && rec.Owner.liveElsewhere() {
			return false, fmt.Errorf("%w: the egress of session %s is enforced by process %d, which attached it; change it there", sandbox.ErrConflict, sessionID, rec.Owner.PID)
		}
		if att != nil {
			if err := att.SetPolicy(ctx, p); err != nil {
				return false, err
			}
		} else {
			if rec.Owner.PID != 0 && rec.Owner != egressSelf() {
				// A dead owner's leftovers go before anything is attached again.
				gw, err := b.egressGateway()
				if err != nil {
					return false, err
				}
				if err := gw.Cleanup(ctx, sessionID); err != nil {
					return false, err
				}
			}
			if p.Mode != spec.EgressDeny {
				if err := resolvConfBound(s.dir); err != nil {
					return false, err
				}
				var err error
				if att, err = b.setupEgress(ctx, s, p); err != nil {
					return false, err
				}
			}
		}
		if att != nil {
			if err := writeResolvConf(s.dir, att.Resolver()); err != nil {
				return false, err
			}
		}
		*rec = egressRecord{Egress: egressSpec(p), Owner: egressSelf()}
		return true, nil
	})
}

func egressSpec(p egress.Policy) spec.Egress {
	return spec.Egress{Mode: p.Mode, Domains: append([]string(nil), p.Domains...)}
}

// EgressCounters are a live sandbox's egress totals since this process attached it; zero for
// a sandbox that never had a network.
func (b *Backend) EgressCounters(ctx context.Context, sessionID string) (egress.Counters, error) {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return egress.Counters{}, err
	}
	if att := b.attachment(sessionID); att != nil {
		return att.Counters(), nil
	}
	rec, err := readEgressRecord(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return egress.Counters{}, nil
	}
	if err != nil {
		return egress.Counters{}, err
	}
	if rec.Owner.liveElsewhere() {
		return egress.Counters{}, fmt.Errorf("%w: the egress of session %s is counted by process %d, which attached it", sandbox.ErrConflict, sessionID, rec.Owner.PID)
	}
	return egress.Counters{}, nil
}

// EgressCounts is the daemon's metric (server.EgressCounter): connections allowed and denied
// by the egress proxy, over every sandbox this process has attached.
func (b *Backend) EgressCounts() (allowed, denied uint64) {
	b.egress.mu.Lock()
	allowed, denied = b.egress.closedAllowed, b.egress.closedDenied
	atts := make([]*egress.Attachment, 0, len(b.egress.atts))
	for _, a := range b.egress.atts {
		atts = append(atts, a)
	}
	b.egress.mu.Unlock()
	for _, a := range atts {
		c := a.Counters()
		allowed += c.ConnsAllowed
		denied += c.ConnsDenied
	}
	return allowed, denied
}

// closeEgress tears down every attachment this process holds and its gateway (Backend.Close):
// the sandboxes keep running without network until a later process adopts them.
func (b *Backend) closeEgress() error {
	b.egress.mu.Lock()
	b.egress.closed = true
	atts := b.egress.atts
	b.egress.atts = nil
	gw := b.egress.gw
	b.egress.gw = nil
	b.egress.mu.Unlock()
	var errs []error
	for _, a := range atts {
		errs = append(errs, b.closeAttachment(a))
	}
	if gw != nil {
		errs = append(errs, gw.Close())
	}
	return errors.Join(errs...)
}

func readEgressRecord(dir string) (*egressRecord, error) {
	data, err := os.ReadFile(filepath.Join(dir, egressFile))
	if err != nil {
		return nil, err
	}
	var rec egressRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, egressFile), err)
	}
	return &rec, nil
}

// withEgressRecord runs fn on egress.json under an exclusive lock on it, so that two
// processes never both take a sandbox's egress over; fn gets nil when there is no record and
// create is false, an empty one when create is true. It writes the record back when fn says so.
func withEgressRecord(dir string, create bool, fn func(*egressRecord) (bool, error)) error {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(filepath.Join(dir, egressFile), flags, 0o600)
	if errors.Is(err, fs.ErrNotExist) && !create {
		_, err = fn(nil)
		return err
	}
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	rec := &egressRecord{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, rec); err != nil {
			return fmt.Errorf("%s: %w", f.Name(), err)
		}
	} else if !create {
		rec = nil
	}
	write, err := fn(rec)
	if err != nil || !write {
		return err
	}
	out, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.WriteAt(out, 0)
	return err
}
