//go:build !unix

package accel

// onReportSignal does nothing where there are no user signals: only collective timeouts write reports.
func onReportSignal(func()) (stop func()) { return func() {} }
