package bus

import (
	"reflect"
	"testing"
)

// TestSurface: the bus only routes; what a harness, a transport or federation alone needs
// lives with it (Bus.Agy, ledger, fed, hub), so the router's exported surface stays small.
// A new method past the bound belongs to one of those, or replaces one here.
func TestSurface(t *testing.T) {
	const max = 30
	if n := reflect.TypeOf(&Bus{}).NumMethod(); n > max {
		var names []string
		for i := range n {
			names = append(names, reflect.TypeOf(&Bus{}).Method(i).Name)
		}
		t.Fatalf("*bus.Bus has %d exported methods, more than %d: %v", n, max, names)
	}
}
