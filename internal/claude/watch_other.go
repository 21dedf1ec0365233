//go:build !linux

package claude

import (
	"errors"
	"fmt"
	"os"
)

// statDir identifies a directory; without inode numbers at hand it only says it exists, so
// every request rescans (there is no watcher either).
func statDir(path string) (dirID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return dirID{}, err
	}
	if !fi.IsDir() {
		return dirID{}, fmt.Errorf("%s is not a directory", path)
	}
	return dirID{}, nil
}

func newWatcher() (watcher, error) {
	return nil, errors.New("claude: no directory watch on this platform")
}
