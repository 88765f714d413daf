// Package netio is Herald's client-protocol server: a gnet v2 event-loop
// server that splits length-prefixed frames, decodes them, enforces the
// per-connection limits and hands requests to the actors through a Router.
//
// # Threading
//
// gnet event-loop callbacks (OnOpen, OnTraffic, OnClose) only split and decode
// frames, answer what netio answers itself (Hello, protocol errors, limits)
// and hand the rest to Router.Route. They never block on disk or on an actor.
// Each connection has one session actor; responses reach the connection by
// being sent to it as *heraldpb.Frame messages, and the session writes them
// through the connection's event loop: the frames that reach a connection
// before its loop gets to them go out together, in one writev
// (conn.writeThen; herald_frames_per_write).
//
// # Hello
//
// Hello is optional and may come at any point, at most once per connection.
// Requests before Hello are served with the server's limits (MaxFrameBytes,
// MaxInFlight), except that the client may send frames of at most
// MaxFrameBytesBeforeHello: a connection must identify itself before it may
// make the broker buffer a large frame.
// Hello negotiates both limits down to the smaller of the client's non-zero
// value and the server's. A Hello with another protocol version is answered
// with UNSUPPORTED_VERSION and leaves the connection open at server defaults;
// a second Hello is answered with INVALID_REQUEST.
//
// # Requests and responses
//
// A request is a Frame whose body is a message named "...Request" (so request
// types added to proto/herald.proto are routed without a change here). A
// client that sends a response body, an Error body or any other non-request
// body violates the protocol: it gets a final UNKNOWN_REQUEST error frame with
// the frame's id and the connection is closed.
//
// # Final error frames
//
// A malformed payload (MALFORMED_FRAME, id 0), a length above the negotiated
// maximum (FRAME_TOO_LARGE, id 0, decided from the header alone), a frame with
// no known body (UNKNOWN_REQUEST, the frame's id), a protocol violation, the
// idle timeout (IDLE_TIMEOUT) and the connection limit (TOO_MANY_CONNECTIONS)
// each get exactly one final error frame. The server then half-closes the
// socket once the frame is flushed (so the peer reads the frame, then EOF,
// rather than a reset), discards whatever else the peer sends, and closes
// fully when the peer closes or after a short linger. Responses to requests
// still in flight when the final frame goes out are dropped (and counted in
// herald_frames_dropped_total): the client must treat those requests as
// having an unknown outcome, as on any lost connection, and the final frame
// is always the last one it reads.
//
// # Flow control
//
// Each connection's pending output and the broker-wide bytes of incomplete
// and queued requests are bounded; over a bound the connection is not read
// (the patched gnet's PauseRead). See output.go for the mechanism and the
// gnet facts it rests on.
package netio
