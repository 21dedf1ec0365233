package creds

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// POSIX ACL as the kernel stores it in the system.posix_acl_access extended attribute:
// a little-endian u32 version (2), then 8-byte entries {u16 tag, u16 perm, u32 id}.
const (
	aclVersion   = 2
	aclHeaderLen = 4
	aclEntryLen  = 8

	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20

	aclPermMask = 0x7 // read, write, execute
)

type aclEntry struct {
	tag  uint16
	perm uint16
	id   uint32
}

// parseACL decodes a system.posix_acl_access value.
func parseACL(b []byte) ([]aclEntry, error) {
	if len(b) < aclHeaderLen || (len(b)-aclHeaderLen)%aclEntryLen != 0 {
		return nil, fmt.Errorf("malformed (%d bytes)", len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != aclVersion {
		return nil, fmt.Errorf("unknown version %d", v)
	}
	var out []aclEntry
	for p := b[aclHeaderLen:]; len(p) > 0; p = p[aclEntryLen:] {
		e := aclEntry{
			tag:  binary.LittleEndian.Uint16(p[0:]),
			perm: binary.LittleEndian.Uint16(p[2:]),
			id:   binary.LittleEndian.Uint32(p[4:]),
		}
		switch e.tag {
		case aclUserObj, aclUser, aclGroupObj, aclGroup, aclMask, aclOther:
		default:
			return nil, fmt.Errorf("unknown entry tag %#x", e.tag)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, errors.New("no entries")
	}
	return out, nil
}

// checkACL refuses an ACL that lets anyone but the owner and uid self access the file.
// Named users, the owning group and named groups are limited by the mask, when there is
// one; others are not.
func checkACL(entries []aclEntry, self uint32) error {
	mask := uint16(aclPermMask)
	for _, e := range entries {
		if e.tag == aclMask {
			mask = e.perm & aclPermMask
		}
	}
	for _, e := range entries {
		eff := e.perm & mask
		switch e.tag {
		case aclUser:
			if e.id != self && eff != 0 {
				return fmt.Errorf("is accessible by uid %d through its ACL", e.id)
			}
		case aclGroupObj:
			if eff != 0 {
				return errors.New("is accessible by its group through its ACL")
			}
		case aclGroup:
			if eff != 0 {
				return fmt.Errorf("is accessible by gid %d through its ACL", e.id)
			}
		case aclOther:
			if e.perm&aclPermMask != 0 {
				return errors.New("is accessible by others through its ACL")
			}
		}
	}
	return nil
}
