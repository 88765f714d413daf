// Checks of transactions across partitions: a committed transaction's
// records all in the log, an aborted (or never ended) one's none, and one
// whose end is of unknown outcome whole or absent.

package checker

import (
	"slices"

	"github.com/heraldmq/herald/chaos/history"
)

// checkTxns checks each transaction (ops sharing a RequestID) against the
// final logs. Its records are the values of its sends that were staged
// (ok); a send of unknown outcome may be in it or not, and only its
// duplication is checked (Duplicated).
func (c *checker) checkTxns() {
	visible := map[string]int{} // value -> position of a read that has it
	for _, p := range c.parts() {
		for _, r := range c.reads[p] {
			for v := range r.first {
				if _, ok := visible[v]; !ok {
					visible[v] = r.pos
				}
			}
		}
	}
	type txn struct {
		sent    []string // values staged for sure
		pos     []int
		outcome string // commit or rollback, as ended; "" when never ended for sure
		unknown bool   // an end was invoked without a sure outcome
	}
	txns := map[string]*txn{}
	var order []string
	get := func(id string) *txn {
		t := txns[id]
		if t == nil {
			t = &txn{}
			txns[id] = t
			order = append(order, id)
		}
		return t
	}
	for i, op := range c.ops {
		switch {
		case op.F == history.TxnSend && op.Type == history.OK:
			t := get(op.RequestID)
			t.sent = append(t.sent, op.Value)
			t.pos = append(t.pos, i)
		case op.F == history.TxnEnd && op.Type == history.OK:
			t := get(op.RequestID)
			t.outcome = op.Outcome
			t.pos = append(t.pos, i)
		case op.F == history.TxnEnd && (op.Type == history.Info || op.Type == history.Invoke && c.done[i] < 0):
			t := get(op.RequestID)
			t.unknown = true
			t.pos = append(t.pos, i)
		}
	}
	for _, id := range order {
		t := txns[id]
		var seen, missing []string
		readPos := []int{}
		for _, v := range t.sent {
			if p, ok := visible[v]; ok {
				seen = append(seen, v)
				readPos = append(readPos, p)
			} else {
				missing = append(missing, v)
			}
		}
		pos := append(slices.Clone(t.pos), readPos...)
		switch {
		case t.outcome == history.OutcomeCommit:
			c.checked(TxnLost, 1)
			if len(missing) > 0 {
				c.add(TxnLost, c.ex(pos, missing, "transaction %s was committed, but %d of its %d staged records are in no replica's read", id, len(missing), len(t.sent)))
			}
		case t.outcome == history.OutcomeRollback || !t.unknown:
			c.checked(TxnAborted, 1)
			if len(seen) > 0 {
				what := "aborted"
				if t.outcome == "" {
					what = "never ended"
				}
				c.add(TxnAborted, c.ex(pos, seen, "transaction %s %s, yet %d of its records are in the log", id, what, len(seen)))
			}
		default:
			c.checked(TxnPartial, 1)
			if len(seen) > 0 && len(missing) > 0 {
				c.add(TxnPartial, c.ex(pos, missing, "transaction %s (end of unknown outcome) is partly visible: %d of its %d records", id, len(seen), len(t.sent)))
			}
		}
	}
}
