// Package ledger is the one home of a message's life below the bus: the closed sets of wire
// words that say what happened (Code, Outcome, Kind, Transport, each with one table), the
// refusal type (Error), and the event stream (Stream) where every change of a message's life
// is announced once, to sinks: the audit log (Audit), the counters behind /metrics (Counter)
// and the monitors (Watchers). Events never carry a message's text.
package ledger
