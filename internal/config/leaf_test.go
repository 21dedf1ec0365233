package config

import (
	"strings"
	"testing"
)

func TestLeafValidation(t *testing.T) {
	base := []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "127.0.0.1:7787"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // "" = accepted
	}{
		{"ok", base, nil, ""},
		{"from env", nil, map[string]string{"XMSG_LEAF": "true", "XMSG_LEAF_PRINCIPAL": "svc:bot", "XMSG_LISTEN": "127.0.0.1:1"}, ""},
		{"no listen (http.sock only)", []string{"--leaf", "--leaf-principal", "svc:bot"}, nil, ""},
		{"no principal", []string{"--leaf", "--listen", "127.0.0.1:7787"}, nil, "--leaf needs --leaf-principal"},
		{"fed listen", append(base, "--fed-listen", "192.0.2.1:7443"), nil, "--leaf forbids --fed-listen"},
		{"svc exe", append(base, "--svc-exe", "bot=/bin/true"), nil, "--leaf forbids --svc-exe"},
		{"svc exe from env", base, map[string]string{"XMSG_SVC_EXE": "bot=/bin/true"}, "--leaf forbids --svc-exe"},
		{"principal without leaf", []string{"--leaf-principal", "svc:bot"}, nil, "need --leaf"},
		{"bad bool", []string{"--leaf=maybe"}, nil, "--leaf"},
		{"listen everywhere", []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "0.0.0.0:7787"}, nil, "not a loopback IP address"},
		{"listen on an interface", []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "192.0.2.1:7787"}, nil, "--leaf-listen-non-loopback allows it"},
		{"listen on a name", []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "localhost:7787"}, nil, "not a loopback IP address"},
		{"listen on ::1", []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "[::1]:7787"}, nil, ""},
		{"listen on 127.0.0.2", []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "127.0.0.2:7787"}, nil, ""},
		{"allowed by name", []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "0.0.0.0:7787", "--leaf-listen-non-loopback"}, nil, ""},
		{"allowed from env", []string{"--leaf", "--leaf-principal", "svc:bot", "--listen", "0.0.0.0:7787"}, map[string]string{"XMSG_LEAF_LISTEN_NON_LOOPBACK": "true"}, ""},
		{"allow without leaf", []string{"--leaf-listen-non-loopback"}, nil, "need --leaf"},
	} {
		e := map[string]string{"HOME": "/home/u"}
		for k, v := range tc.env {
			e[k] = v
		}
		c, err := Parse(tc.args, env(e))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error with %q", tc.name, err, tc.want)
		case tc.want == "" && (!c.Leaf || c.LeafPrincipal != "svc:bot"):
			t.Errorf("%s: got %+v", tc.name, c)
		}
	}
	c, err := Parse(append(base, "--register-sock", "/r/register.sock"), env(map[string]string{"HOME": "/h"}))
	if err != nil || c.LeafRegisterSock != "/r/register.sock" {
		t.Errorf("leaf register sock falls back to --register-sock: %v %v", c, err)
	}
	c, err = Parse(append(base, "--register-sock", "/r/register.sock", "--leaf-register-sock", "/l/reg.sock"), env(map[string]string{"HOME": "/h"}))
	if err != nil || c.LeafRegisterSock != "/l/reg.sock" {
		t.Errorf("--leaf-register-sock wins: %v %v", c, err)
	}
}

func TestLeafFlagsInHelp(t *testing.T) {
	var b strings.Builder
	Usage(&b)
	for _, want := range []string{"--leaf ", "XMSG_LEAF,", "--leaf-principal", "XMSG_LEAF_PRINCIPAL", "--leaf-register-sock", "XMSG_LEAF_REGISTER_SOCK"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}
