package config

import (
	"strings"
	"testing"
	"time"
)

func TestCustodyFlags(t *testing.T) {
	env := func(string) string { return "" }
	svc := []string{"--svc-exe", "a=/bin/a,b=/bin/b,c=/bin/c"}
	c, err := Parse(append(svc, "--custody", "tok=svc:a,svc:b", "--custody", "gh=svc:c", "--custody-file", "tok=/run/keys/tok"), env)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Custody) != 2 || c.Custody[0].Name != "gh" || c.Custody[1].Name != "tok" {
		t.Fatalf("custody %+v", c.Custody)
	}
	if got := strings.Join(c.Custody[1].Allow, ","); got != "a,b" || c.Custody[1].File != "/run/keys/tok" || c.Custody[0].File != "" {
		t.Errorf("tok %+v", c.Custody[1])
	}
	if c.CustodyReloadInterval != 30*time.Second {
		t.Errorf("reload %v", c.CustodyReloadInterval)
	}
	c, err = Parse(nil, func(k string) string {
		return map[string]string{"XMSG_CUSTODY": "x=svc:a;y=svc:b", "XMSG_CUSTODY_FILE": "x=/k/x,y=/k/y", "XMSG_SVC_EXE": "a=/bin/a,b=/bin/b"}[k]
	})
	if err != nil || len(c.Custody) != 2 || c.Custody[1].File != "/k/y" {
		t.Fatalf("env: %+v %v", c, err)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--custody", "tok=claude:alice"}, "only svc:<name>"},
		{[]string{"--custody", "tok=fed:peer"}, "only svc:<name>"},
		{[]string{"--custody", "tok=a"}, "only svc:<name>"},
		{[]string{"--custody", "tok=svc:"}, "only svc:<name>"},
		{[]string{"--custody", "tok="}, "only svc:<name>"},
		{[]string{"--custody", "../x=svc:a"}, "want NAME="},
		{[]string{"--custody", "tok=svc:a", "--custody", "tok=svc:b"}, "given twice"},
		{[]string{"--custody-file", "tok=/k"}, "no --custody tok"},
		{[]string{"--custody", "tok=svc:a", "--custody-file", "tok=relative"}, "absolute"},
		{[]string{"--custody", "tok=svc:nosuch"}, "svc:nosuch has no --svc-exe"},
	} {
		if _, err := Parse(append(svc, bad.args...), env); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.args, err, bad.want)
		}
	}
	// A leaf forbids custody (checked with no --svc-exe: a leaf forbids that too).
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--custody", "tok=svc:a", "--leaf", "--listen", "127.0.0.1:1", "--leaf-principal", "svc:m"}, "--leaf forbids --custody"},
	} {
		if _, err := Parse(bad.args, env); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.args, err, bad.want)
		}
	}
}
