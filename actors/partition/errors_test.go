package partition

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
)

// TestStorageErrorMapping checks each kind of log failure reaches the
// producer as a clear, typed wire error.
func TestStorageErrorMapping(t *testing.T) {
	wrap := func(errno syscall.Errno) error {
		return fmt.Errorf("%w: wal write: %w", persistence.ErrStorage, &os.PathError{Op: "write", Path: "seg", Err: errno})
	}
	cases := []struct {
		err       error
		code      heraldpb.ErrorCode
		retriable bool
		says      string
	}{
		{wrap(syscall.ENOSPC), heraldpb.ErrorCode_STORAGE_ERROR, true, "disk full"},
		{wrap(syscall.EACCES), heraldpb.ErrorCode_STORAGE_ERROR, true, "permission denied"},
		{wrap(syscall.EROFS), heraldpb.ErrorCode_STORAGE_ERROR, true, "permission denied"},
		{wrap(syscall.EIO), heraldpb.ErrorCode_STORAGE_ERROR, true, "input/output error"},
		{fmt.Errorf("read: %w", persistence.ErrOffsetOutOfRange), heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE, false, "out of range"},
	}
	for _, c := range cases {
		e := storageError(c.err)
		if e.Code != c.code || e.Retriable != c.retriable || !strings.Contains(e.Message, c.says) {
			t.Errorf("%v -> %v (retriable %v) %q; want %v, %v, mentioning %q", c.err, e.Code, e.Retriable, e.Message, c.code, c.retriable, c.says)
		}
		if c.code == heraldpb.ErrorCode_STORAGE_ERROR && e.RetryAfterMs == 0 {
			t.Errorf("%v: STORAGE_ERROR without a retry-after", c.err)
		}
	}
}
