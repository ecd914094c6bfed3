package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"

	"github.com/vishvananda/netns"

	"github.com/airlock-sandbox/airlock/backend/local/egresswire"
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

// egressState is the backend's gateway (made on first use) and the attachments it holds.
type egressState struct {
	mu     sync.Mutex
	gw     *egress.Gateway
	atts   map[string]*egress.Attachment // by session id
	closed bool
	// Totals of attachments already closed, so that EgressCounts only grows.
	closedAllowed, closedDenied uint64
}

// egressEnforceable tells whether this host can enforce egress needing capability name: the
// published set says so when egress.Probe passed within hostProbeTTL, in this process or
// another on the same state dir (airlock run would otherwise build and drop a throwaway
// network namespace, ~2 ms, on every call with the network on); else this process's own probe
// says why not. A mechanism lost since then fails when the gateway is wired, at create.
func (b *Backend) egressEnforceable(name capability.Name) error {
	return egresswire.Enforceable(b.caps, egresswire.Probe)(name)
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
		opts.Upstream = egress.ResolvConfNameservers("/etc/resolv.conf")
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
	if err := egresswire.UpdateRecord(s.dir, true, func(rec *egresswire.Record) (bool, error) {
		*rec = egresswire.Record{Egress: s.rec.Spec.Egress, Owner: egresswire.Self()}
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
	if p.Mode != spec.EgressDeny && len(b.opts.Egress.Upstream) == 0 && len(egress.ResolvConfNameservers("/etc/resolv.conf")) == 0 {
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
	rec, err := egresswire.ReadRecord(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // egress deny from the start: nothing was ever attached
	}
	if err != nil {
		return err
	}
	if rec.Owner == egresswire.Self() || rec.Owner.LiveElsewhere() {
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
	return egresswire.UpdateRecord(s.dir, false, func(rec *egresswire.Record) (bool, error) {
		if rec == nil || rec.Owner.LiveElsewhere() {
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
		rec.Owner = egresswire.Self()
		if p.Mode == spec.EgressDeny {
			return true, nil // attached again by a later SetEgress that widens it
		}
		att, err := b.setupEgress(ctx, s, p)
		if err != nil {
			return false, err
		}
		b.log.Info("egress re-attached", "session", s.rec.ID, "mode", p.Mode, "resolver", att.Resolver())
		return true, egresswire.WriteResolvConf(s.dir, att.Resolver())
	})
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
	if err := egresswire.Check(e, s.rec.Runtime == string(spec.RuntimeGVisor), b.egressEnforceable); err != nil {
		return err
	}
	p := egress.PolicyFromSpec(e)
	s.mu.Lock() // against destroy
	defer s.mu.Unlock()
	if s.gone || s.exited() {
		return fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, sessionID)
	}
	return egresswire.UpdateRecord(s.dir, true, func(rec *egresswire.Record) (bool, error) {
		att := b.attachment(sessionID)
		if att == nil && rec.Owner.LiveElsewhere() {
			return false, fmt.Errorf("%w: the egress of session %s is enforced by process %d, which attached it; change it there", sandbox.ErrConflict, sessionID, rec.Owner.PID)
		}
		if att != nil {
			if err := att.SetPolicy(ctx, p); err != nil {
				return false, err
			}
		} else {
			if rec.Owner.PID != 0 && rec.Owner != egresswire.Self() {
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
				if err := egresswire.ResolvConfBound(s.dir); err != nil {
					return false, err
				}
				var err error
				if att, err = b.setupEgress(ctx, s, p); err != nil {
					return false, err
				}
			}
		}
		if att != nil {
			if err := egresswire.WriteResolvConf(s.dir, att.Resolver()); err != nil {
				return false, err
			}
		}
		*rec = egresswire.Record{Egress: egressSpec(p), Owner: egresswire.Self()}
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
	rec, err := egresswire.ReadRecord(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return egress.Counters{}, nil
	}
	if err != nil {
		return egress.Counters{}, err
	}
	if rec.Owner.LiveElsewhere() {
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
