package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// apiError is what client-go returns for a response of code with message (a Status the API
// server wrote).
func apiError(code int32, reason metav1.StatusReason, message string, retryAfter int32) error {
	s := metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: message}
	if retryAfter > 0 {
		s.Details = &metav1.StatusDetails{RetryAfterSeconds: retryAfter}
	}
	return &apierrors.StatusError{ErrStatus: s}
}

func TestTransient(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	testCases := map[string]struct {
		err  error
		want bool
	}{
		// The reported failure: etcd's leader was the member just removed. The API server
		// passes etcd's error through as an unknown-reason 500.
		"etcd leader failure through the API server": {err: fmt.Errorf("recording: %w", apiError(500, metav1.StatusReasonUnknown, "etcdserver: request timed out, possibly due to previous leader failure", 0)), want: true},
		"etcd leader changed":                        {err: apiError(500, metav1.StatusReasonUnknown, "etcdserver: leader changed", 0), want: true},
		"internal error":                             {err: apierrors.NewInternalError(errors.New("boom")), want: true},
		"API server shutting down (503)":             {err: apierrors.NewServiceUnavailable("shutting down"), want: true},
		"too many requests (429)":                    {err: apierrors.NewTooManyRequests("slow down", 2), want: true},
		"server timeout":                             {err: apierrors.NewServerTimeout(gr, "create", 1), want: true},
		"gateway timeout (504)":                      {err: apierrors.NewTimeoutError("request did not complete", 0), want: true},
		"bad gateway (502)":                          {err: apiError(502, metav1.StatusReasonUnknown, "bad gateway", 0), want: true},
		"connection refused":                         {err: &url.Error{Op: "Get", URL: "https://127.0.0.1:6443", Err: &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}, want: true},
		"connection reset":                           {err: &url.Error{Op: "Get", URL: "https://127.0.0.1:6443", Err: &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}}, want: true},
		"unexpected EOF":                             {err: fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), want: true},
		"a request's own deadline":                   {err: fmt.Errorf("list: %w", context.DeadlineExceeded), want: true},
		"gRPC Unavailable":                           {err: status.Error(codes.Unavailable, "connection refused"), want: true},
		"gRPC ResourceExhausted":                     {err: status.Error(codes.ResourceExhausted, "rate limited"), want: true},
		"says so itself":                             {err: selfClassified(true), want: true},
		"not yet":                                    {err: fmt.Errorf("waiting: %w", NotYet(errors.New("the record is not seen yet"))), want: true},

		"forbidden":                             {err: apierrors.NewForbidden(gr, "x", errors.New("no")), want: false},
		"unauthorized":                          {err: apierrors.NewUnauthorized("who"), want: false},
		"invalid":                               {err: apierrors.NewBadRequest("bad"), want: false},
		"not found":                             {err: apierrors.NewNotFound(gr, "x"), want: false},
		"already exists":                        {err: apierrors.NewAlreadyExists(gr, "x"), want: false},
		"conflict":                              {err: apierrors.NewConflict(gr, "x", errors.New("changed")), want: false},
		"canceled":                              {err: fmt.Errorf("list: %w", context.Canceled), want: false},
		"gRPC PermissionDenied":                 {err: status.Error(codes.PermissionDenied, "wrong key"), want: false},
		"unknown error":                         {err: errors.New("the node's evidence was refused"), want: false},
		"says it is not":                        {err: selfClassified(false), want: false},
		"nil":                                   {err: nil, want: false},
		"a conflict whose text reads transient": {err: apiError(409, metav1.StatusReasonConflict, "etcdserver: request timed out", 0), want: false},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, Transient(tc.err))
		})
	}
}

type selfClassified bool

func (s selfClassified) Error() string   { return fmt.Sprintf("transient=%v", bool(s)) }
func (s selfClassified) Transient() bool { return bool(s) }

func TestAfter(t *testing.T) {
	withInfo, err := status.New(codes.ResourceExhausted, "rate limited").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(5 * time.Second)})
	require.NoError(t, err)
	testCases := map[string]struct {
		err    error
		want   time.Duration
		wantOK bool
	}{
		"429 with Retry-After":        {err: apierrors.NewTooManyRequests("slow down", 3), want: 3 * time.Second, wantOK: true},
		"503 with Retry-After":        {err: apiError(503, metav1.StatusReasonServiceUnavailable, "later", 7), want: 7 * time.Second, wantOK: true},
		"wrapped":                     {err: fmt.Errorf("step: %w", apiError(503, metav1.StatusReasonServiceUnavailable, "later", 7)), want: 7 * time.Second, wantOK: true},
		"gRPC RetryInfo":              {err: withInfo.Err(), want: 5 * time.Second, wantOK: true},
		"WithDelay":                   {err: fmt.Errorf("x: %w", WithDelay(errors.New("busy"), 4*time.Second)), want: 4 * time.Second, wantOK: true},
		"503 without Retry-After":     {err: apierrors.NewServiceUnavailable("later")},
		"gRPC status without details": {err: status.Error(codes.ResourceExhausted, "rate limited")},
		"plain error":                 {err: errors.New("x")},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, ok := After(tc.err)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// fakeDeadline has a deadline on the fake clock's time line; it never ends by itself.
type fakeDeadline struct {
	context.Context
	deadline time.Time
}

func (f fakeDeadline) Deadline() (time.Time, bool) { return f.deadline, true }

// recordingClock fires every wait at once and records it.
type recordingClock struct {
	now   time.Time
	waits []time.Duration
}

func (c *recordingClock) Now() time.Time { return c.now }
func (c *recordingClock) After(d time.Duration) <-chan time.Time {
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

func TestDo(t *testing.T) {
	leader := apiError(500, metav1.StatusReasonUnknown, "etcdserver: request timed out, possibly due to previous leader failure", 0)
	reset := &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "x", errors.New("no"))
	slowDown := apierrors.NewTooManyRequests("slow down", 30)
	policy := Policy{Initial: time.Second, Max: 8 * time.Second, Factor: 2}

	testCases := map[string]struct {
		errs      []error // what the attempts return, in order; then success
		ctxFor    time.Duration
		wantWaits []time.Duration
		wantErr   []string
		wantIs    []error
		wantBare  error // the error returned as is
	}{
		"success at once": {},
		"transient errors, then success": {
			errs:      []error{leader, reset, leader, leader, leader},
			wantWaits: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second},
		},
		"Retry-After is honoured over a shorter back-off": {
			errs:      []error{slowDown},
			wantWaits: []time.Duration{30 * time.Second},
		},
		"permanent at once: the error itself": {
			errs: []error{forbidden}, wantBare: forbidden,
		},
		"permanent after transient: first and last named": {
			errs:      []error{leader, forbidden},
			wantWaits: []time.Duration{time.Second},
			wantErr:   []string{"forbidden", "first error: etcdserver: request timed out, possibly due to previous leader failure", "after 2 attempts"},
			wantIs:    []error{forbidden, leader},
		},
		"deadline: gives up before a wait that would outlast it": {
			errs:      []error{leader, reset, reset, reset, reset, reset},
			ctxFor:    5 * time.Second,
			wantWaits: []time.Duration{time.Second, 2 * time.Second},
			wantErr:   []string{"connection reset", "first error: etcdserver: request timed out", "gave up after 3 attempts", "deadline exceeded"},
			wantIs:    []error{context.DeadlineExceeded, leader},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			clock := &recordingClock{now: time.Unix(1000, 0)}
			p := policy
			p.Clock = clock
			ctx := context.Background()
			if tc.ctxFor > 0 {
				// The deadline is on the fake clock's time line: Do compares it with
				// clock.Now, which starts at 1000 s.
				ctx = fakeDeadline{Context: ctx, deadline: clock.now.Add(tc.ctxFor)}
			}
			calls := 0
			err := Do(ctx, p, nil, func(context.Context) error {
				calls++
				if calls <= len(tc.errs) {
					return tc.errs[calls-1]
				}
				return nil
			})
			assert.Equal(t, tc.wantWaits, clock.waits)
			switch {
			case tc.wantBare != nil:
				assert.Same(t, tc.wantBare, err)
			case len(tc.wantErr) > 0:
				require.Error(t, err)
				for _, want := range tc.wantErr {
					assert.Contains(t, err.Error(), want)
				}
				for _, target := range tc.wantIs {
					assert.ErrorIs(t, err, target)
				}
			default:
				require.NoError(t, err)
			}
		})
	}
}

// Jitter spreads the waits, within the bound.
func TestDoJitterBounded(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	p := Policy{Initial: time.Second, Max: 4 * time.Second, Factor: 2, Jitter: 0.5, Clock: clock}
	calls := 0
	require.NoError(t, Do(context.Background(), p, nil, func(context.Context) error {
		calls++
		if calls <= 20 {
			return apierrors.NewServiceUnavailable("restarting")
		}
		return nil
	}))
	require.Len(t, clock.waits, 20)
	distinct := map[time.Duration]bool{}
	for i, w := range clock.waits {
		base := min(time.Second<<i, 4*time.Second)
		assert.GreaterOrEqual(t, w, base, "wait %d", i)
		assert.LessOrEqual(t, w, base+base/2, "wait %d", i)
		distinct[w] = true
	}
	assert.Greater(t, len(distinct), 10, "jittered waits differ")
}

func TestHistory(t *testing.T) {
	var h History
	assert.Empty(t, h.String())
	require.NoError(t, h.Err(nil))
	h.Add(errors.New("connection refused"))
	assert.Equal(t, "connection refused", h.String())
	h.Add(errors.New("rate limited"))
	h.Add(errors.New("rate limited"))
	assert.Equal(t, "rate limited (first error: connection refused)", h.String())
	assert.Equal(t, 3, h.Attempts())
	err := h.Err(context.DeadlineExceeded)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, "rate limited (first error: connection refused); gave up after 3 attempts: context deadline exceeded", err.Error())
}
