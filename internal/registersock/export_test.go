package registersock

// SetTestSubscribed has f run in each poll's wait between its subscription and its poll
// (nil: nothing).
func SetTestSubscribed(s *Server, f func()) {
	if f == nil {
		s.testSubscribed.Store(nil)
		return
	}
	s.testSubscribed.Store(&f)
}
