package heraldpb

import "fmt"

// retriable lists the codes a client may retry; everything else is final.
var retriable = map[ErrorCode]bool{
	ErrorCode_NOT_LEADER:          true,
	ErrorCode_THROTTLED:           true,
	ErrorCode_TOO_MANY_IN_FLIGHT:  true,
	ErrorCode_STORAGE_ERROR:       true,
	ErrorCode_TIMEOUT:             true,
	ErrorCode_SHUTTING_DOWN:       true,
	ErrorCode_NOT_ENOUGH_REPLICAS: true,
	ErrorCode_NOT_COORDINATOR:     true,
	ErrorCode_NOT_READY:           true,
}

// IsRetriableCode reports whether an operation that failed with code may
// succeed if retried unchanged.
func IsRetriableCode(code ErrorCode) bool { return retriable[code] }

// NewError builds a wire Error with its retriable flag taken from the registry.
func NewError(code ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Retriable: IsRetriableCode(code), Message: fmt.Sprintf(format, args...)}
}

// ErrorFrame answers frame id with err.
func ErrorFrame(id uint64, err *Error) *Frame {
	return &Frame{Id: id, Body: &Frame_Error{Error: err}}
}

// Error makes *Error a Go error, so the client can return and wrap it.
func (e *Error) Error() string {
	if e.GetRetryAfterMs() > 0 {
		return fmt.Sprintf("herald %s: %s (retry after %dms)", e.GetCode(), e.GetMessage(), e.GetRetryAfterMs())
	}
	return fmt.Sprintf("herald %s: %s", e.GetCode(), e.GetMessage())
}
