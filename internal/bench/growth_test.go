package bench

import "testing"

// TestGrowth: the disk's drift between two paths is taken out of their ratio (each path's
// commit p50 exchanged for the other's), unless the commits' sample says more than the path's
// own latency (noise on a busy machine): then the ratio stands as measured, never negative.
func TestGrowth(t *testing.T) {
	for _, c := range []struct {
		name         string
		small, large Figure
		want         float64
	}{
		{"drift out", Figure{P50us: 500, CommitP50us: 400}, Figure{P50us: 600, CommitP50us: 500}, 1.0},
		{"no commits", Figure{P50us: 500}, Figure{P50us: 600}, 1.2},
		{"noisy commits", Figure{P50us: 500, CommitP50us: 100}, Figure{P50us: 400, CommitP50us: 900}, 0.8},
	} {
		if g := growth(c.name, c.small, c.large); g.Ratio != c.want {
			t.Errorf("%s: ratio %v, want %v", c.name, g.Ratio, c.want)
		}
	}
}
