package provider

import (
	"context"
	"fmt"
	"io"
)

type progressKey struct{}

// WithProgress returns a context whose provider calls write their progress lines to w: a
// platform whose operations take minutes (a cloud's) says what it waits for at least every
// 5 s, and the CLI shows it.
func WithProgress(ctx context.Context, w io.Writer) context.Context {
	return context.WithValue(ctx, progressKey{}, w)
}

// Progressf writes one progress line to the writer of ctx (WithProgress), if it has one.
func Progressf(ctx context.Context, format string, args ...any) {
	if w, ok := ctx.Value(progressKey{}).(io.Writer); ok && w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}
