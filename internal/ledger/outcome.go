package ledger

// Outcome is what is known of a message or a reply at one point of its life (docs/protocol.md
// §1: outcome, push_outcome). A closed set with one table of wire words; an outcome says only
// what is known: written to an inbox is not seen by a person, queued is not acked.
type Outcome uint8

const (
	// NoOutcome is the absent outcome (a refused request has a Code instead).
	NoOutcome Outcome = iota
	// Message outcomes (the `outcome` field).
	Delivered   // handed over: a Claude inbox took the line, agentapi ran, a service acked
	Queued      // committed in a recipient's queue or a leaf's mailbox, not yet taken
	Accepted    // a federation pre-record: the peer has not answered yet
	Undelivered // recorded, then the hand-over failed
	Held        // the recipient's harness holds it for a person's decision
	Denied      // the recipient's person refused it
	Expired     // the recipient's harness dropped it undecided, or retention removed it
	Dropped     // the recipient's harness discarded it unseen (its ingress guard)
	// What a receiving node records of a message it could not hand to anyone (an inbound
	// envelope whose target did not resolve, a leaf's rejected row): why nobody got it.
	NoRecipient        // no session matched its target
	AmbiguousRecipient // more than one did
	RecipientGone      // the session had exited
	NotTaken           // anything else
	// Reply push outcomes (the `pushOutcome` field).
	Pushed
	SenderGone
	PushFailed
	PushDisabled
	numOutcomes
)

var outcomes = [numOutcomes]string{
	NoOutcome:          "",
	Delivered:          "delivered",
	Queued:             "queued",
	Accepted:           "accepted",
	Undelivered:        "delivery_failed",
	Held:               "held",
	Denied:             "denied",
	Expired:            "expired",
	Dropped:            "dropped",
	NoRecipient:        "not_found",
	AmbiguousRecipient: "ambiguous",
	RecipientGone:      "gone",
	NotTaken:           "failed",
	Pushed:             "pushed",
	SenderGone:         "sender_gone",
	PushFailed:         "push_failed",
	PushDisabled:       "disabled",
}

// String is the outcome's wire word ("" for NoOutcome).
func (o Outcome) String() string {
	if o >= numOutcomes {
		return ""
	}
	return outcomes[o]
}

// MarshalText writes the wire word.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads a wire word; an unknown one reads as NoOutcome.
func (o *Outcome) UnmarshalText(b []byte) error {
	*o, _ = ParseOutcome(string(b))
	return nil
}

// ParseOutcome is the outcome of a wire word (a stored record's, a peer's answer).
func ParseOutcome(word string) (Outcome, bool) {
	for i, w := range outcomes {
		if w == word && i != int(NoOutcome) {
			return Outcome(i), true
		}
	}
	return NoOutcome, false
}
