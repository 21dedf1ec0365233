package codex

import (
	"fmt"

	"github.com/xmsg/xmsg/internal/safeopen"
)

func statBeneath(root, rel string) (safeopen.ID, error) { return safeopen.Stat(root, rel) }

func readHeaderBeneath(root, rel string) (Header, safeopen.ID, error) {
	f, id, err := safeopen.Open(root, rel)
	if err != nil {
		return Header{}, safeopen.ID{}, fmt.Errorf("codex: rollout: %w", err)
	}
	defer f.Close()
	h, err := ReadHeader(f)
	return h, id, err
}
