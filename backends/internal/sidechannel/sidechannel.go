// Package sidechannel is the optional interface of goaccel's collective engines that carry short messages
// beside the collectives (the MPI engine does): the Communicator announces through it that a rank closes or
// failed. It is internal: only engines in goaccel's backends tree implement it.
package sidechannel

// Messenger is implemented by engines with a side channel beside the collectives: short messages that a
// rank sends to every other rank without the others calling anything to match them. The Communicator uses
// it to tell the other ranks that this rank closes or failed, so that a rank waiting for it in a
// collective stops with an error naming it instead of waiting until its timeout.
//
// An engine that implements Messenger has a collective Close (MPI_Finalize waits for every rank): the
// Communicator closes it only once every rank announced that it closes.
type Messenger interface {
	// Notify sends msg to every other rank without waiting for them to receive it.
	Notify(msg []byte) error
	// Notices returns the messages received from other ranks since the last call, without blocking.
	Notices() ([]Notice, error)
}

// Notice is a message received through a Messenger.
type Notice struct {
	From int
	Msg  []byte
}
