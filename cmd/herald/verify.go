package main

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
)

func init() {
	register("verify", "check that every record a bench --ack-log lists as acknowledged is stored", cliRunner(verifyCmd))
}

const verifyUsage = "usage: herald verify --topic T --ack-log FILE [--addr HOST:PORT,...]"

// The acknowledgement log: `herald bench --ack-log FILE` records which
// records the broker acknowledged (each bench record carries its
// producer's id and sequence number), and `herald verify` reads the
// topic back and checks that every one of them is stored, and how often.
type ackLog struct {
	Topic      string `json:"topic"`
	RunStartNs int64  `json:"run_start_ns"`
	// Producers' acknowledged sequence numbers, as bitsets: base64 of
	// little-endian 64-bit words, bit s%64 of word s/64 for sequence s.
	Producers []ackLogProducer `json:"producers"`
}

type ackLogProducer struct {
	ID    int    `json:"id"`
	Count int64  `json:"count"`
	Acked string `json:"acked"`
}

// benchAckSet collects a bench's acknowledged records.
type benchAckSet struct {
	mu   []sync.Mutex
	bits [][]uint64
}

func newBenchAckSet(producers int) *benchAckSet {
	return &benchAckSet{mu: make([]sync.Mutex, producers), bits: make([][]uint64, producers)}
}

func (s *benchAckSet) add(id int, seq int64) {
	s.mu[id].Lock()
	defer s.mu[id].Unlock()
	w := int(seq / 64)
	if w >= len(s.bits[id]) {
		s.bits[id] = append(s.bits[id], make([]uint64, max(w+1, 2*len(s.bits[id]))-len(s.bits[id]))...)
	}
	s.bits[id][w] |= 1 << (seq % 64)
}

// write saves the set to path.
func (s *benchAckSet) write(path, topic string, runStart time.Time) error {
	doc := ackLog{Topic: topic, RunStartNs: runStart.UnixNano()}
	for id := range s.bits {
		s.mu[id].Lock()
		raw := make([]byte, 8*len(s.bits[id]))
		var n int64
		for i, w := range s.bits[id] {
			binary.LittleEndian.PutUint64(raw[8*i:], w)
			n += int64(bits.OnesCount64(w))
		}
		s.mu[id].Unlock()
		doc.Producers = append(doc.Producers, ackLogProducer{ID: id, Count: n, Acked: base64.StdEncoding.EncodeToString(raw)})
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// readAckLog loads an acknowledgement log: per producer, its bitset.
func readAckLog(path string) (*ackLog, [][]uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	doc, words, err := parseAckLog(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return doc, words, nil
}

// parseAckLog decodes an acknowledgement log.
func parseAckLog(data []byte) (*ackLog, [][]uint64, error) {
	var doc ackLog
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, nil, err
	}
	bits := make([][]uint64, len(doc.Producers))
	for _, p := range doc.Producers {
		raw, err := base64.StdEncoding.DecodeString(p.Acked)
		if err != nil || len(raw)%8 != 0 || p.ID < 0 || p.ID >= len(bits) || bits[p.ID] != nil {
			return nil, nil, fmt.Errorf("producer %d: bad bitset", p.ID)
		}
		words := make([]uint64, len(raw)/8)
		for i := range words {
			words[i] = binary.LittleEndian.Uint64(raw[8*i:])
		}
		bits[p.ID] = words
	}
	for id := range bits {
		if bits[id] == nil {
			bits[id] = []uint64{}
		}
	}
	return &doc, bits, nil
}

// verifyCmd runs "herald verify": reads every partition of the topic from
// its log start to its high watermark and checks the bench records of
// the run the acknowledgement log describes.
func verifyCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("verify", io.err)
	topic := fs.String("topic", "", "the topic the bench wrote (default: the one in the log)")
	logPath := fs.String("ack-log", "", "the acknowledgement log `herald bench --ack-log` wrote")
	fs.Usage = func() {
		fmt.Fprintln(io.err, verifyUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *logPath == "" {
		return usagef("%s", verifyUsage)
	}
	doc, acked, err := readAckLog(*logPath)
	if err != nil {
		return cliOneLine(err)
	}
	if *topic == "" {
		*topic = doc.Topic
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	info, err := c.DescribeTopic(ctx, *topic)
	if err != nil {
		return cliOneLine(err)
	}
	// seen[id][seq]: how often the record is stored (saturating at 255).
	seen := make([][]uint8, len(acked))
	var stored, others int64
	for _, p := range info.GetPartitions() {
		off, end := p.GetLogStartOffset(), p.GetHighWatermark()
		var retryUntil time.Time
		for off < end {
			r, err := c.Fetch(ctx, *topic, int32(p.GetId()), off, 4<<20, 0)
			var he *client.Error
			if errors.As(err, &he) && he.Retriable {
				// A leader moving: try again, for up to a minute.
				if retryUntil.IsZero() {
					retryUntil = time.Now().Add(time.Minute)
				}
				if time.Now().Before(retryUntil) {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
			}
			retryUntil = time.Time{}
			if err != nil {
				return cliOneLine(fmt.Errorf("reading %s-%d at %d: %w", *topic, p.GetId(), off, err))
			}
			for _, m := range r.Messages {
				v := m.Value
				if len(v) < benchHeader || int64(binary.BigEndian.Uint64(v)) < doc.RunStartNs {
					others++
					continue
				}
				w := binary.BigEndian.Uint64(v[8:])
				id, seq := int(w>>benchSeqBits), int64(w&(1<<benchSeqBits-1))
				if id >= len(seen) {
					others++
					continue
				}
				if int64(len(seen[id])) <= seq {
					seen[id] = append(seen[id], make([]uint8, max(seq+1, 2*int64(len(seen[id])))-int64(len(seen[id])))...)
				}
				if seen[id][seq] < 255 {
					seen[id][seq]++
				}
				stored++
			}
			if r.NextOffset <= off {
				break
			}
			off = r.NextOffset
		}
	}
	var nAcked, missing, dups, unacked int64
	for id, words := range acked {
		for wi, w := range words {
			for ; w != 0; w &= w - 1 {
				seq := int64(wi*64) + int64(bits.TrailingZeros64(w))
				nAcked++
				if seq >= int64(len(seen[id])) || seen[id][seq] == 0 {
					missing++
				}
			}
		}
		for seq, n := range seen[id] {
			if n > 1 {
				dups += int64(n - 1)
			}
			if n > 0 && (seq/64 >= len(words) || words[seq/64]&(1<<(seq%64)) == 0) {
				unacked++
			}
		}
	}
	notAcked := plural(unacked, "stored record") + " of the run were not acknowledged"
	if unacked == 1 {
		notAcked = "1 stored record of the run was not acknowledged"
	}
	fmt.Fprintf(io.out, "verified %s of topic %s: %d missing, %d stored more than once; %s (allowed: the producer gave up or was killed before the answer), %s of other runs\n",
		plural(nAcked, "acknowledged record"), *topic, missing, dups, notAcked, plural(others, "record"))
	switch {
	case missing == 1:
		return errors.New("1 acknowledged record is missing")
	case missing > 0:
		return fmt.Errorf("%d acknowledged records are missing", missing)
	}
	return nil
}
