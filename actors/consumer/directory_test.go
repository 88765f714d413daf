package consumer

import (
	"sync"
	"sync/atomic"
	"testing"
)

// The direct call path never pushes more calls to a member than its budget,
// however many network loops take at once.
func TestLaneTakeRespectsBudget(t *testing.T) {
	var l lane
	a, b := &laneMember{member: "a"}, &laneMember{member: "b"}
	a.budget.Store(300)
	b.budget.Store(200)
	l.set(func([]*laneMember) []*laneMember { return []*laneMember{a, b} })
	var got [2]atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m := l.take()
				if m == nil {
					return
				}
				if m == a {
					got[0].Add(1)
				} else {
					got[1].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got[0].Load() != 300 || got[1].Load() != 200 || a.budget.Load() != 0 || b.budget.Load() != 0 {
		t.Fatalf("took %d from a and %d from b; budgets left %d, %d", got[0].Load(), got[1].Load(), a.budget.Load(), b.budget.Load())
	}
	l.set(func(ms []*laneMember) []*laneMember { return ms[:1] })
	a.budget.Store(1)
	if l.take() != a || l.take() != nil {
		t.Fatal("take after removing b")
	}
}
