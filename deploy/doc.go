// Package deploy holds deployment examples that are not systemd units: kubernetes/leaf-pod.json,
// a pod with an xmsg leaf beside a bot (see README.md). It has no code; its test decodes the
// manifest strictly and asserts the pod's security fields.
package deploy
