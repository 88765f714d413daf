/*
 * Copyright (c) 2021 The Gnet Authors. All rights reserved.
 *
 * Licensed under the Apache License, Version 2.0 (the "License");
 * you may not use this file except in compliance with the License.
 * You may obtain a copy of the License at
 *
 *      http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS,
 * WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
 * See the License for the specific language governing permissions and
 * limitations under the License.
 *
 */

package gnet

import (
	"io"

	"golang.org/x/sys/unix"

	"github.com/panjf2000/gnet/v2/pkg/netpoll"
	"github.com/panjf2000/gnet/v2/pkg/queue"
)

func (c *conn) processIO(_ int, ev netpoll.IOEvent, _ netpoll.IOFlags) error {
	el := c.loop
	// First check for any unexpected non-IO events.
	// For these events we just close the connection directly.
	if ev&(netpoll.ErrEvents|unix.EPOLLRDHUP) != 0 && ev&netpoll.ReadWriteEvents == 0 {
		c.outboundBuffer.Release() // don't bother to write to a connection that is already broken
		return el.close(c, io.EOF)
	}
	// Secondly, check for EPOLLOUT before EPOLLIN, the former has a higher priority
	// than the latter regardless of the aliveness of the current connection:
	//
	// 1. When the connection is alive and the system is overloaded, we want to
	// offload the incoming traffic by writing all pending data back to the remotes
	// before continuing to read and handle requests.
	// 2. When the connection is dead, we need to try writing any pending data back
	// to the remote first and then close the connection.
	//
	// We perform eventloop.write for EPOLLOUT because it can take good care of either case.
	if ev&(netpoll.WriteEvents|netpoll.ErrEvents) != 0 {
		if err := el.write(c); err != nil {
			return err
		}
	}
	// Check for EPOLLIN before EPOLLRDHUP in case that there are pending data in
	// the socket buffer.
	if ev&(netpoll.ReadEvents|netpoll.ErrEvents) != 0 {
		if err := el.read(c); err != nil {
			return err
		}
	}
	// Ultimately, check for EPOLLRDHUP, this event indicates that the remote has
	// either closed connection or shut down the writing half of the connection.
	if ev&unix.EPOLLRDHUP != 0 && c.opened {
		if ev&unix.EPOLLIN == 0 { // unreadable EPOLLRDHUP, close the connection directly
			return el.close(c, io.EOF)
		}
		// Received the event of EPOLLIN|EPOLLRDHUP, but the previous eventloop.read
		// failed to drain the socket buffer, so we ensure to get it done this time.
		c.isEOF = true
		return el.read(c)
	}
	return nil
}

// watchWrite watches writable events of c, and readable ones unless reads
// are paused (Herald patch).
func (c *conn) watchWrite(isET bool) error {
	if c.readPaused {
		return c.loop.poller.ModWrite(&c.pollAttachment, isET)
	}
	return c.loop.poller.ModReadWrite(&c.pollAttachment, isET)
}

// unwatchWrite stops watching writable events of c in level-triggered mode,
// once its outbound buffer is empty (Herald patch).
func (c *conn) unwatchWrite() error {
	if c.readPaused {
		return c.loop.poller.ModNone(&c.pollAttachment, false)
	}
	return c.loop.poller.ModRead(&c.pollAttachment, false)
}

// PauseRead stops reading c's socket (Herald patch): readable events are no
// longer watched, so what the peer sends stays in the kernel's receive
// buffer and TCP flow control pushes back on the peer. Writable events are
// still watched while the outbound buffer holds data. What is already in
// the inbound buffer stays there. Idempotent. Call it on c's event loop only.
func (c *conn) PauseRead() error {
	if !c.opened || c.readPaused {
		return nil
	}
	c.readPaused = true
	isET := c.loop.engine.opts.EdgeTriggeredIO
	if isET || !c.outboundBuffer.IsEmpty() {
		return c.loop.poller.ModWrite(&c.pollAttachment, isET)
	}
	return c.loop.poller.ModNone(&c.pollAttachment, false)
}

// ResumeRead undoes PauseRead (Herald patch). It does not call OnTraffic for
// bytes already in the inbound buffer: the caller handles those itself.
// Idempotent. Call it on c's event loop only.
func (c *conn) ResumeRead() error {
	if !c.opened || !c.readPaused {
		return nil
	}
	c.readPaused = false
	isET := c.loop.engine.opts.EdgeTriggeredIO
	if isET {
		if err := c.loop.poller.ModReadWrite(&c.pollAttachment, true); err != nil {
			return err
		}
		// The edge may have passed while paused: read once now.
		return c.loop.poller.Trigger(queue.LowPriority, c.loop.read0, c)
	}
	if !c.outboundBuffer.IsEmpty() {
		return c.loop.poller.ModReadWrite(&c.pollAttachment, false)
	}
	return c.loop.poller.ModRead(&c.pollAttachment, false)
}

// ReadPaused reports whether PauseRead is in effect (Herald patch). Call it
// on c's event loop only.
func (c *conn) ReadPaused() bool { return c.readPaused }
