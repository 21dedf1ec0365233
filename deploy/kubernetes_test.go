package deploy

// The Kubernetes example is JSON, not YAML: kubectl accepts both, the standard library has no
// YAML parser and the project adds no modules. JSON also lets the test decode the manifest
// strictly into the subset of the Pod API it uses: every key must be one of the fields below,
// spelled exactly (encoding/json alone matches keys case-insensitively, the API server does
// not), so a misspelled security field (readOnlyRootFileSystem), which the API server would
// drop with a warning and a lenient check would never see, fails here.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

type pod struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec podSpec `json:"spec"`
}

type podSpec struct {
	AutomountServiceAccountToken *bool              `json:"automountServiceAccountToken"`
	EnableServiceLinks           *bool              `json:"enableServiceLinks"`
	HostNetwork                  bool               `json:"hostNetwork"`
	HostPID                      bool               `json:"hostPID"`
	HostIPC                      bool               `json:"hostIPC"`
	SecurityContext              podSecurityContext `json:"securityContext"`
	Containers                   []container        `json:"containers"`
	Volumes                      []volume           `json:"volumes"`
}

type podSecurityContext struct {
	RunAsNonRoot   *bool           `json:"runAsNonRoot"`
	RunAsUser      *int64          `json:"runAsUser"`
	RunAsGroup     *int64          `json:"runAsGroup"`
	FSGroup        *int64          `json:"fsGroup"`
	SeccompProfile *seccompProfile `json:"seccompProfile"`
}

type seccompProfile struct {
	Type string `json:"type"`
}

type container struct {
	Name            string            `json:"name"`
	Image           string            `json:"image"`
	ImagePullPolicy string            `json:"imagePullPolicy"`
	Command         []string          `json:"command"`
	Args            []string          `json:"args"`
	Env             []envVar          `json:"env"`
	Ports           []json.RawMessage `json:"ports"`
	SecurityContext *securityContext  `json:"securityContext"`
	VolumeMounts    []volumeMount     `json:"volumeMounts"`
	Resources       json.RawMessage   `json:"resources"`
	LivenessProbe   *probe            `json:"livenessProbe"`
	ReadinessProbe  *probe            `json:"readinessProbe"`
}

type probe struct {
	Exec *struct {
		Command []string `json:"command"`
	} `json:"exec"`
	HTTPGet          json.RawMessage `json:"httpGet"`
	TCPSocket        json.RawMessage `json:"tcpSocket"`
	PeriodSeconds    int             `json:"periodSeconds"`
	TimeoutSeconds   int             `json:"timeoutSeconds"`
	FailureThreshold int             `json:"failureThreshold"`
}

// probeCommand is the exec probe a kubelet runs in the leaf's container: the image has no
// shell and no PATH of its own, so /bin/xmsg (nix/image.nix) and its health subcommand.
var probeCommand = []string{"/bin/xmsg", "health"}

type envVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type securityContext struct {
	ReadOnlyRootFilesystem   *bool           `json:"readOnlyRootFilesystem"`
	RunAsNonRoot             *bool           `json:"runAsNonRoot"`
	RunAsUser                *int64          `json:"runAsUser"`
	AllowPrivilegeEscalation *bool           `json:"allowPrivilegeEscalation"`
	Privileged               *bool           `json:"privileged"`
	Capabilities             *capabilities   `json:"capabilities"`
	SeccompProfile           *seccompProfile `json:"seccompProfile"`
}

type capabilities struct {
	Drop []string `json:"drop"`
	Add  []string `json:"add"`
}

type volumeMount struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly"`
}

type volume struct {
	Name     string `json:"name"`
	EmptyDir *struct {
		Medium    string `json:"medium"`
		SizeLimit string `json:"sizeLimit"`
	} `json:"emptyDir"`
	Secret *struct {
		SecretName  string `json:"secretName"`
		DefaultMode *int   `json:"defaultMode"`
		Items       []struct {
			Key  string `json:"key"`
			Path string `json:"path"`
		} `json:"items"`
	} `json:"secret"`
}

const manifest = "kubernetes/leaf-pod.json"

// The image's paths (nix/image.nix): its XDG_RUNTIME_DIR and XDG_STATE_HOME volumes.
const (
	imageRuntimeDir = "/run/xmsg"
	imageStateDir   = "/var/lib/xmsg"
)

// credentialNames are the names the daemon reads from $CREDENTIALS_DIRECTORY.
var credentialNames = []string{"fed-cert", "fed-key", "fed-ca", "peers"}

// exactKeys checks that every object key of v (the manifest decoded as any) is the exact
// json name of a field of t, recursively.
func exactKeys(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := v.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Map:
			for k, e := range v {
				if err := exactKeys(e, t.Elem(), path+"."+k); err != nil {
					return err
				}
			}
			return nil
		case reflect.Struct:
		default:
			if t == reflect.TypeOf(json.RawMessage{}) {
				return nil // free-form on purpose (resources, ports)
			}
			return fmt.Errorf("%s: an object where %s is expected", path, t)
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			fields[name] = t.Field(i).Type
		}
		for k, e := range v {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("%s: unknown field %q", path, k)
			}
			if err := exactKeys(e, ft, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		if t == reflect.TypeOf(json.RawMessage{}) {
			return nil
		}
		if t.Kind() != reflect.Slice {
			return fmt.Errorf("%s: a list where %s is expected", path, t)
		}
		for i, e := range v {
			if err := exactKeys(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func decodePod(b []byte) (*pod, error) {
	var generic any
	if err := json.Unmarshal(b, &generic); err != nil {
		return nil, err
	}
	if err := exactKeys(generic, reflect.TypeOf(pod{}), "pod"); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p pod
	if err := dec.Decode(&p); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the pod")
	}
	return &p, nil
}

func readPod(t *testing.T) *pod {
	t.Helper()
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	p, err := decodePod(b)
	if err != nil {
		t.Fatalf("%s: %v", manifest, err)
	}
	return p
}

func isTrue(b *bool) bool  { return b != nil && *b }
func isFalse(b *bool) bool { return b != nil && !*b }

var listenArg = regexp.MustCompile(`^--listen(=|$)`)

// checkPod returns every way p breaks the leaf pod's rules (none for the example).
func checkPod(p *pod) []string {
	var bad []string
	badf := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	if p.APIVersion != "v1" || p.Kind != "Pod" {
		badf("apiVersion/kind: got %s/%s, want v1/Pod", p.APIVersion, p.Kind)
	}
	s := p.Spec
	// The pod never accepts a connection from outside and shares nothing with the node.
	if s.HostNetwork || s.HostPID || s.HostIPC {
		badf("spec: hostNetwork/hostPID/hostIPC must stay false")
	}
	if !isFalse(s.AutomountServiceAccountToken) {
		badf("spec.automountServiceAccountToken: want false (neither container talks to the API server)")
	}
	psc := s.SecurityContext
	if !isTrue(psc.RunAsNonRoot) {
		badf("spec.securityContext.runAsNonRoot: want true")
	}
	// The peer gate admits only the daemon's own uid: the bot must run as the same user.
	if psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		badf("spec.securityContext.runAsUser: want one non-root uid for every container (the leaf's peer gate admits only its own uid)")
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != "RuntimeDefault" {
		badf("spec.securityContext.seccompProfile.type: want RuntimeDefault")
	}

	vols := map[string]volume{}
	for _, v := range s.Volumes {
		vols[v.Name] = v
	}
	var leaf, bots []container
	for _, c := range s.Containers {
		if strings.HasPrefix(c.Image, "xmsg:") {
			leaf = append(leaf, c)
		} else {
			bots = append(bots, c)
		}
	}
	if len(leaf) != 1 || len(bots) == 0 {
		badf("containers: got %d xmsg leaf container(s) and %d other(s), want one leaf beside the bot", len(leaf), len(bots))
		return bad
	}

	for _, c := range s.Containers {
		sc := c.SecurityContext
		if sc == nil {
			badf("container %s: no securityContext", c.Name)
			continue
		}
		if !isTrue(sc.ReadOnlyRootFilesystem) {
			badf("container %s: readOnlyRootFilesystem: want true", c.Name)
		}
		if !isTrue(sc.RunAsNonRoot) {
			badf("container %s: runAsNonRoot: want true", c.Name)
		}
		if !isFalse(sc.AllowPrivilegeEscalation) {
			badf("container %s: allowPrivilegeEscalation: want false", c.Name)
		}
		if isTrue(sc.Privileged) {
			badf("container %s: privileged: want false", c.Name)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) != 0 {
			badf("container %s: capabilities: want drop [ALL] and nothing added", c.Name)
		}
		if sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault" {
			badf("container %s: seccompProfile.type: want RuntimeDefault", c.Name)
		}
		if sc.RunAsUser != nil && psc.RunAsUser != nil && *sc.RunAsUser != *psc.RunAsUser {
			badf("container %s: runAsUser %d differs from the pod's %d: the leaf's peer gate would refuse it", c.Name, *sc.RunAsUser, *psc.RunAsUser)
		}
		if len(c.Ports) != 0 {
			badf("container %s: ports: the pod accepts no connection from outside", c.Name)
		}
		for _, m := range c.VolumeMounts {
			if v, ok := vols[m.Name]; ok && v.Secret != nil && (c.Name != leaf[0].Name || !m.ReadOnly) {
				badf("container %s: secret volume %s: only the leaf mounts it, read-only", c.Name, m.Name)
			}
			if _, ok := vols[m.Name]; !ok {
				badf("container %s: mounts volume %s, which the pod does not declare", c.Name, m.Name)
			}
		}
	}

	// The leaf: `xmsg serve --leaf --leaf-principal svc:<bot>`, its HTTP API on http.sock in the
	// shared volume (behind the peer gate); `--listen 127.0.0.1:PORT` only for a bot that
	// cannot use a Unix socket.
	l := leaf[0]
	args := l.Args
	if len(l.Command) != 0 {
		badf("container %s: command: leave it to the image's entrypoint (xmsg)", l.Name)
	}
	if (len(args) != 4 && len(args) != 6) || args[0] != "serve" || args[1] != "--leaf" || args[2] != "--leaf-principal" || (len(args) == 6 && args[4] != "--listen") {
		badf("container %s: args %q: want serve --leaf --leaf-principal svc:<bot> [--listen 127.0.0.1:PORT]", l.Name, args)
	} else {
		principal := args[3]
		if !slices.ContainsFunc(bots, func(b container) bool { return principal == "svc:"+b.Name }) {
			badf("container %s: --leaf-principal %q: want svc:<the bot container's name>", l.Name, principal)
		}
		if len(args) == 6 {
			host, _, err := net.SplitHostPort(args[5])
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				badf("container %s: --listen %q: want a loopback address (the pod's own network only)", l.Name, args[5])
			}
		}
	}
	// Probes a kubelet can run: an exec of the image's xmsg, no shell, no port (the leaf
	// listens on no pod-reachable address to probe).
	for name, pr := range map[string]*probe{"livenessProbe": l.LivenessProbe, "readinessProbe": l.ReadinessProbe} {
		if pr == nil || pr.Exec == nil || !slices.Equal(pr.Exec.Command, probeCommand) || pr.HTTPGet != nil || pr.TCPSocket != nil {
			badf("container %s: %s: want exec %q", l.Name, name, probeCommand)
		}
	}
	for _, a := range args {
		if strings.HasPrefix(a, "--fed-listen") {
			badf("container %s: %s: a leaf never listens for federation", l.Name, a)
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(args), func(a string) bool { return !listenArg.MatchString(a) })); n > 1 {
		badf("container %s: --listen given %d times", l.Name, n)
	}
	env := map[string]string{}
	for _, e := range l.Env {
		env[e.Name] = e.Value
	}
	mounts := map[string]volumeMount{}
	for _, m := range l.VolumeMounts {
		mounts[m.MountPath] = m
	}
	run, ok := mounts[imageRuntimeDir]
	if !ok || vols[run.Name].EmptyDir == nil {
		badf("container %s: %s (the image's XDG_RUNTIME_DIR) must be an emptyDir volume", l.Name, imageRuntimeDir)
	}
	if m, ok := mounts[imageStateDir]; !ok || m.ReadOnly {
		badf("container %s: %s (the image's XDG_STATE_HOME, the store) must be a writable volume", l.Name, imageStateDir)
	}
	credDir := env["CREDENTIALS_DIRECTORY"]
	cm, ok := mounts[credDir]
	if credDir == "" || !ok || !cm.ReadOnly || vols[cm.Name].Secret == nil {
		badf("container %s: CREDENTIALS_DIRECTORY=%q: want the read-only mount of the Secret", l.Name, credDir)
	} else {
		sec := vols[cm.Name].Secret
		if sec.DefaultMode == nil || *sec.DefaultMode&0o137 != 0 {
			badf("volume %s: defaultMode: want no write bit, nothing for others (0400 or 0440)", cm.Name)
		}
		var keys []string
		for _, it := range sec.Items {
			if it.Key != it.Path || !slices.Contains(credentialNames, it.Key) {
				badf("volume %s: item %s -> %s: want a credential name as both key and path (%q)", cm.Name, it.Key, it.Path, credentialNames)
			}
			keys = append(keys, it.Key)
		}
		for _, need := range []string{"fed-cert", "fed-key", "peers"} {
			if !slices.Contains(keys, need) {
				badf("volume %s: item %s missing: the leaf needs its certificate, its key and the peers file", cm.Name, need)
			}
		}
	}

	// The bot shares the leaf's socket volume and nothing else.
	for _, b := range bots {
		if len(b.VolumeMounts) != 1 || b.VolumeMounts[0].Name != run.Name {
			badf("container %s: volumeMounts %+v: want only the leaf's socket volume %s", b.Name, b.VolumeMounts, run.Name)
		}
	}
	return bad
}

func TestLeafPodExample(t *testing.T) {
	p := readPod(t)
	for _, problem := range checkPod(p) {
		t.Error(problem)
	}
	if *p.Spec.SecurityContext.RunAsUser != 65532 {
		t.Errorf("runAsUser: got %d, want 65532, the image's User (nix/image.nix)", *p.Spec.SecurityContext.RunAsUser)
	}
	// The probes' executable exists in the image: nix/image.nix links it.
	img, err := os.ReadFile("../nix/image.nix")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(img), "ln -s ${lib.getExe xmsg} ."+probeCommand[0]) {
		t.Errorf("nix/image.nix does not link %s, which the probes run", probeCommand[0])
	}
}

// TestLeafPodChecks is the positive control: each rule of checkPod rejects a manifest that
// breaks it (a mutant of the example per rule).
func TestLeafPodChecks(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		mutate     func(p *pod)
	}{
		{"writable root", "readOnlyRootFilesystem", func(p *pod) { p.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = nil }},
		{"root allowed", "runAsNonRoot", func(p *pod) { f := false; p.Spec.Containers[1].SecurityContext.RunAsNonRoot = &f }},
		{"pod root allowed", "spec.securityContext.runAsNonRoot", func(p *pod) { p.Spec.SecurityContext.RunAsNonRoot = nil }},
		{"escalation", "allowPrivilegeEscalation", func(p *pod) { t := true; p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &t }},
		{"a capability kept", "capabilities", func(p *pod) { p.Spec.Containers[1].SecurityContext.Capabilities.Drop = []string{"NET_RAW"} }},
		{"a capability added", "capabilities", func(p *pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []string{"NET_BIND_SERVICE"}
		}},
		{"unconfined seccomp", "seccompProfile", func(p *pod) { p.Spec.Containers[0].SecurityContext.SeccompProfile.Type = "Unconfined" }},
		{"pod seccomp", "spec.securityContext.seccompProfile", func(p *pod) { p.Spec.SecurityContext.SeccompProfile = nil }},
		{"privileged", "privileged", func(p *pod) { t := true; p.Spec.Containers[1].SecurityContext.Privileged = &t }},
		{"host network", "hostNetwork", func(p *pod) { p.Spec.HostNetwork = true }},
		{"token", "automountServiceAccountToken", func(p *pod) { p.Spec.AutomountServiceAccountToken = nil }},
		{"other uid", "runAsUser", func(p *pod) { u := int64(1000); p.Spec.Containers[1].SecurityContext.RunAsUser = &u }},
		{"port", "ports", func(p *pod) {
			p.Spec.Containers[0].Ports = []json.RawMessage{json.RawMessage(`{"containerPort":7787}`)}
		}},
		{"listen everywhere", "--listen", func(p *pod) {
			p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--listen", "0.0.0.0:7787")
		}},
		{"no liveness probe", "livenessProbe", func(p *pod) { p.Spec.Containers[0].LivenessProbe = nil }},
		{"a shell probe", "readinessProbe", func(p *pod) { p.Spec.Containers[0].ReadinessProbe.Exec.Command = []string{"sh", "-c", "xmsg health"} }},
		{"wrong principal", "--leaf-principal", func(p *pod) { p.Spec.Containers[0].Args[3] = "svc:someone-else" }},
		{"not a leaf", "args", func(p *pod) { p.Spec.Containers[0].Args[1] = "--verbose" }},
		{"bot sees the secret", "secret volume", func(p *pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, volumeMount{Name: "xmsg-fed", MountPath: "/s", ReadOnly: true})
		}},
		{"bot sees the state", "only the leaf's socket volume", func(p *pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, volumeMount{Name: "xmsg-state", MountPath: "/var/lib/xmsg"})
		}},
		{"secret writable", "read-only", func(p *pod) { p.Spec.Containers[0].VolumeMounts[2].ReadOnly = false }},
		{"secret world-readable", "defaultMode", func(p *pod) { m := 0o444; p.Spec.Volumes[2].Secret.DefaultMode = &m }},
		{"no key", "item fed-key missing", func(p *pod) { p.Spec.Volumes[2].Secret.Items = p.Spec.Volumes[2].Secret.Items[:1] }},
		{"state read-only", "XDG_STATE_HOME", func(p *pod) { p.Spec.Containers[0].VolumeMounts[1].ReadOnly = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := readPod(t)
			tc.mutate(p)
			problems := checkPod(p)
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("mutant %q: problems %q, want one mentioning %q", tc.name, problems, tc.want)
			}
		})
	}
}

// TestLeafPodStrictDecoding: a misspelled field is an error, not silently dropped, whether it
// differs in case only or not at all.
func TestLeafPodStrictDecoding(t *testing.T) {
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, typo := range [][2]string{
		{`"readOnlyRootFilesystem"`, `"readOnlyRootFileSystem"`},
		{`"allowPrivilegeEscalation"`, `"allowPrivilegeEscalaton"`},
		{`"drop"`, `"Drop"`},
	} {
		bad := bytes.Replace(b, []byte(typo[0]), []byte(typo[1]), 1)
		if bytes.Equal(bad, b) {
			t.Fatalf("the manifest has no %s to misspell", typo[0])
		}
		if _, err := decodePod(bad); err == nil || !strings.Contains(err.Error(), strings.Trim(typo[1], `"`)) {
			t.Errorf("misspelled %s: got %v, want an unknown-field error naming it", typo[1], err)
		}
	}
}
