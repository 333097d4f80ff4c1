package joinclient

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/openconstellation/constellation/api/join/joinpb"
)

// TryIssueJoinTicket is one attempt (as Join makes it) asking endpoint for a join ticket with
// an empty request; nil when the service answered with a ticket.
func TryIssueJoinTicket(ctx context.Context, dial Dialer, endpoint string, timeout time.Duration) error {
	failed := attempt(ctx, dial, endpoint, timeout, func(ctx context.Context, client joinpb.JoinServiceClient, _ func(_, _ []byte) error, opts ...grpc.CallOption) error {
		_, err := client.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{}, opts...)
		return err
	})
	if failed == nil {
		return nil
	}
	return failed
}
