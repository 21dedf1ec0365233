package registersock

import (
	"errors"
	"net"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
)

// credential answers a registered service's `{"action":"credential","name":N}` (this daemon's
// extension, docs/protocol.md §4.4): the secret N, if the custody policy names this service,
// as a sealed read-only memfd passed by SCM_RIGHTS with the answer
// `{"status":"ok","credential":{"name","pin"}}`; never the value. The answer is written here
// (the descriptor must travel with it), so resp is nil; ok is false when it could not be.
// Refusals are error lines with custody's codes (not_found, op_denied, unattested).
func (s *Server) credential(c net.Conn, reg *bus.Registration, line []byte) (resp []byte, ok bool) {
	name, err := credentialName(line)
	if err != nil {
		s.refuse(reg.Caller().Actor(), "credential", "bad request")
		return errorLine(ledger.BadRequest, err.Error()), true
	}
	p := custody.Principal{Actor: reg.Caller().Actor(), PID: reg.PID, Alive: func() bool { return s.cfg.Bus.Alive(reg) }}
	// Only a service attested by its executable (svc) is a principal custody can name; a
	// uid-admitted session of the same name is not.
	if s.cfg.Bus.Harnesses().Is(reg.Harness, harness.Exe) {
		p.Service = reg.Name
	}
	refusal, err := s.cfg.Custody.Hand(c, name, p, writeTimeout)
	if refusal != nil {
		return errorLine(refusal.Code, refusal.Detail), true
	}
	if err != nil {
		s.cfg.Log.Debug("write abandoned", "socket", "register", "actor", p.Actor, "err", err)
		return nil, false
	}
	return nil, true
}

// credentialName reads the frame's "name" (required).
func credentialName(line []byte) (string, error) {
	obj, err := jsonline.Decode(line)
	if err != nil {
		return "", errors.New(decodeError(err))
	}
	name, err := obj.String("name")
	if err != nil {
		return "", errors.New(decodeError(err))
	}
	if name == "" {
		return "", errors.New("name is required")
	}
	return name, nil
}
