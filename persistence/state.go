package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// The state file holds the raft HardState, ConfState and snapshot point.
// It changes at every vote and term change, which a raft group must make
// durable before it answers: with thousands of groups, an election round
// writes thousands of them. It is therefore two fixed slots, written in
// turn in place with one fsync each (no temp file, rename or directory
// fsync): each slot holds a sequence number, the encoded state and a
// CRC32C. Reading takes the valid slot with the higher sequence. A write
// torn by a crash fails its CRC, and the other slot, the previous state,
// is what was last made durable, so nothing acknowledged is lost.
//
// The file is created whole (both slots) with WriteFileAtomic, the only
// time its directory entry changes. A state file of the earlier
// single-record format is read as is and replaced the same way.

const (
	slotMagic = "HRLDSS02"
	slotSize  = 4096
	// slotHeader: magic, sequence (8), length (4), CRC32C (4).
	slotHeader = len(slotMagic) + 8 + 4 + 4
)

// encodeSlot returns the slot bytes of state st with sequence seq.
func encodeSlot(st *diskState, seq uint64) ([]byte, error) {
	body := encodeState(st)
	if len(body) > slotSize-slotHeader {
		return nil, fmt.Errorf("state of %d bytes exceeds a %d-byte slot", len(body), slotSize)
	}
	b := make([]byte, slotHeader, slotSize)
	copy(b, slotMagic)
	binary.LittleEndian.PutUint64(b[len(slotMagic):], seq)
	binary.LittleEndian.PutUint32(b[len(slotMagic)+8:], uint32(len(body)))
	b = append(b, body...)
	crc := crc32.Checksum(b[len(slotMagic):len(slotMagic)+12], castagnoli)
	crc = crc32.Update(crc, castagnoli, body)
	binary.LittleEndian.PutUint32(b[len(slotMagic)+12:], crc)
	return b[:slotSize], nil
}

// decodeSlot parses one slot; ok is false for an empty, torn or damaged one.
func decodeSlot(b []byte) (st diskState, seq uint64, ok bool) {
	if len(b) < slotHeader || string(b[:len(slotMagic)]) != slotMagic {
		return st, 0, false
	}
	seq = binary.LittleEndian.Uint64(b[len(slotMagic):])
	n := int(binary.LittleEndian.Uint32(b[len(slotMagic)+8:]))
	if n > len(b)-slotHeader {
		return st, 0, false
	}
	body := b[slotHeader : slotHeader+n]
	crc := crc32.Checksum(b[len(slotMagic):len(slotMagic)+12], castagnoli)
	if crc32.Update(crc, castagnoli, body) != binary.LittleEndian.Uint32(b[len(slotMagic)+12:]) {
		return st, 0, false
	}
	st, err := decodeState(body)
	return st, seq, err == nil
}

// decodeStateFile parses a whole state file: two slots, or the earlier
// single-record format (seq 0: the next write replaces the file).
func decodeStateFile(b []byte) (st diskState, seq uint64, slotted bool, err error) {
	if len(b) >= len(slotMagic) && string(b[:len(slotMagic)]) == stateMagic {
		st, err = decodeState(b)
		return st, 0, false, err
	}
	if len(b) != 2*slotSize {
		return st, 0, false, corruptf("state file: %d bytes, want %d", len(b), 2*slotSize)
	}
	s0, q0, ok0 := decodeSlot(b[:slotSize])
	s1, q1, ok1 := decodeSlot(b[slotSize:])
	switch {
	case ok0 && (!ok1 || q0 > q1):
		return s0, q0, true, nil
	case ok1:
		return s1, q1, true, nil
	}
	return st, 0, false, corruptf("state file: neither slot is valid")
}

// readState reads the state file; found is false if there is none.
func (l *Log) readState() (st diskState, found bool, err error) {
	f, err := l.fs.OpenFile(l.statePath, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return diskState{}, false, nil
	}
	if err != nil {
		return diskState{}, false, storageErr("open state", err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return diskState{}, false, storageErr("read state", err)
	}
	st, seq, slotted, err := decodeStateFile(b)
	if err != nil {
		return diskState{}, false, fmt.Errorf("%s: %w", l.statePath, err)
	}
	if slotted {
		l.stateSeq = seq
	}
	return st, true, nil
}

// writeState makes st the durable state: in the slot after the newest,
// with one fsync; the first write of a log creates the file whole.
func (l *Log) writeState(st diskState) error {
	if l.stateFile == nil {
		if err := l.createStateFile(st); err != nil {
			return storageErr("write state", err)
		}
		l.persisted = st
		return nil
	}
	seq := l.stateSeq + 1
	b, err := encodeSlot(&st, seq)
	if err != nil {
		return storageErr("write state", err)
	}
	if _, err := l.stateFile.WriteAt(b, int64(seq%2)*slotSize); err != nil {
		return storageErr("write state", err)
	}
	if err := l.syncFile(l.stateFile); err != nil {
		return storageErr("sync state", err)
	}
	l.stateSeq = seq
	l.persisted = st
	return nil
}

// createStateFile replaces the state file atomically with one holding st
// in the next slot (the other slot empty), and opens it for slot writes.
func (l *Log) createStateFile(st diskState) error {
	seq := l.stateSeq + 1
	slot, err := encodeSlot(&st, seq)
	if err != nil {
		return err
	}
	b := make([]byte, 2*slotSize)
	copy(b[int64(seq%2)*slotSize:], slot)
	if err := WriteFileAtomic(l.fs, l.statePath, b, 0o640); err != nil {
		return err
	}
	f, err := l.fs.OpenFile(l.statePath, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	l.stateFile, l.stateSeq = f, seq
	return nil
}
