module github.com/xmsg/xmsg

go 1.26.0

require (
	github.com/coreos/go-systemd/v22 v22.7.0
	github.com/google/uuid v1.6.0
	github.com/landlock-lsm/go-landlock v0.11.2
	go.etcd.io/bbolt v1.5.0
	golang.org/x/sys v0.50.0
)

require kernel.org/pub/linux/libs/security/libcap/psx v1.2.78 // indirect
