package agentsock

import (
	"errors"
	"net"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
)

// credential answers `{"action":"credential","name":N}` (this daemon's extension,
// docs/protocol.md §4.4) from a process attested by ancestry: `xmsg exec --credential`, run
// by (or below) a registered service, asks for the service's secret so that the service
// itself never holds it. The policy is the service's: the secret must name it, and its
// registered process must still run its trusted executable. A caller attributed to anything
// but a service (a Claude session, a uid-only session, Codex, agy) is refused op_denied.
// The answer carries the descriptor (SCM_RIGHTS) and is written here, so resp is nil.
// still reports whether the caller and the service it was attributed to are still the
// processes they were (custody asks once it has read the executable by pid).
func (s *Server) credential(c net.Conn, caller bus.Caller, pid int, line []byte, still func() bool) (resp []byte, keep bool) {
	name, err := credentialName(line)
	if err != nil {
		s.refuse(caller.Actor(), "credential", ledger.BadRequest, "invalid frame")
		return errorLine(ledger.BadRequest, err.Error()), true
	}
	p := custody.Principal{Actor: caller.Actor(), PID: pid, Via: pid, Alive: still}
	if reg := caller.Service(); reg != nil {
		p.Service, p.PID = reg.Name, reg.PID
	}
	refusal, err := s.cfg.Custody.Hand(c, name, p, s.cfg.WriteTimeout)
	if refusal != nil {
		return errorLine(refusal.Code, refusal.Detail), true
	}
	if err != nil {
		s.cfg.Log.Debug("write abandoned", "socket", "agent", "actor", caller.Actor(), "err", err)
		return nil, false
	}
	return nil, true
}

// unattested answers a credential frame whose caller the ancestor walk attributed to no
// session: custody's refusal (and its audit line), code unattested.
func (s *Server) unattested(actor string, pid int, line []byte, detail string) []byte {
	name, _ := credentialName(line)
	err := s.cfg.Custody.Unattested(name, custody.Principal{Actor: actor, PID: pid, Via: pid}, detail)
	return errorLine(ledger.Unattested, err.(*custody.Error).Detail)
}

func credentialName(line []byte) (string, error) {
	obj, err := jsonline.Decode(line)
	if err != nil {
		return "", err
	}
	name, err := obj.String("name")
	if err != nil {
		return "", err
	}
	if name == "" {
		return "", errors.New("name is required")
	}
	return name, nil
}
