//go:build race

package store

// raceDetector: this test binary runs under the race detector.
const raceDetector = true
