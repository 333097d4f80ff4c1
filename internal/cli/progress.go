package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/openconstellation/constellation/internal/retry"
)

// progressEvery is how often a waiting command says, per node, what it waits for and the last
// error: a command that is silent for minutes cannot be told from one that hangs.
const progressEvery = 5 * time.Second

// cliClock is the clock of the commands' waits and progress lines; tests replace it.
var cliClock clock.WithTicker = clock.RealClock{}

// progress is what a waiting command reports every progressEvery: for each node it still
// waits for, what it waits for and the node's errors (the last, and the first when it
// differs: the retries' own errors, a rate limit say, must not hide the cause). Safe for
// concurrent use.
type progress struct {
	t     *phaseTimer
	clock clock.WithTicker
	every time.Duration

	mu    sync.Mutex
	order []string
	nodes map[string]*nodeWait
}

type nodeWait struct {
	what string
	errs retry.History
	// errAt is when the last error was recorded: an error older than a report interval is
	// shown with its age, so a wait whose calls succeed again (an API server back after a
	// restart) does not read as failing still.
	errAt time.Time
	done  bool
}

func newProgress(t *phaseTimer) *progress {
	return &progress{t: t, clock: cliClock, every: progressEvery, nodes: map[string]*nodeWait{}}
}

func (p *progress) node(name string) *nodeWait {
	w, ok := p.nodes[name]
	if !ok {
		w = &nodeWait{}
		p.nodes[name] = w
		p.order = append(p.order, name)
	}
	return w
}

// waiting says what the command waits for on node now.
func (p *progress) waiting(node, what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.node(node)
	w.what, w.done = what, false
}

// step says the command now runs a new step for node, what: the errors of its earlier steps
// are not this step's (they were retried away, or the step before would have failed).
func (p *progress) step(node, what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.node(node)
	w.what, w.done = what, false
	w.errs, w.errAt = retry.History{}, time.Time{}
}

// failed records an error of node's current wait.
func (p *progress) failed(node string, err error) {
	if err == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.node(node)
	w.errs.Add(err)
	w.errAt = p.clock.Now()
}

// done says the command no longer waits for node.
func (p *progress) done(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.node(node).done = true
}

// describe is "what; last error: …" of node.
func (p *progress) describe(node string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.describeLocked(node, p.clock.Now())
}

func (p *progress) describeLocked(node string, now time.Time) string {
	w, ok := p.nodes[node]
	if !ok {
		return "not started"
	}
	s := w.what
	if w.errs.Attempts() > 0 {
		if s != "" {
			s += "; "
		}
		age := ""
		if d := now.Sub(w.errAt); d > p.every {
			age = fmt.Sprintf(" (%s ago)", d.Round(time.Second))
		}
		s += fmt.Sprintf("last error%s: %s", age, &w.errs)
		if n := w.errs.Attempts(); n > 1 {
			s += fmt.Sprintf(" [%d errors]", n)
		}
	}
	return s
}

// history is node's errors so far.
func (p *progress) history(node string) retry.History {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w, ok := p.nodes[node]; ok {
		return w.errs
	}
	return retry.History{}
}

// pending lists the nodes still waited for, in the order they were first named.
func (p *progress) pending() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, n := range p.order {
		if !p.nodes[n].done {
			out = append(out, n)
		}
	}
	return out
}

// summary is "node (what; last error: …); …" of the nodes still waited for, for the error of
// a wait that ran out of time.
func (p *progress) summary() string {
	var parts []string
	for _, n := range p.pending() {
		parts = append(parts, fmt.Sprintf("%s (waiting for %s)", n, p.describe(n)))
	}
	return strings.Join(parts, "; ")
}

// report prints one line per node still waited for.
func (p *progress) report(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.order {
		if w := p.nodes[n]; !w.done {
			p.t.note(now, "waiting", fmt.Sprintf("%s: %s", n, p.describeLocked(n, p.clock.Now())))
		}
	}
}

// start reports every p.every until stop is called (which waits for the last report to end).
func (p *progress) start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	ticker := p.clock.NewTicker(p.every)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-ticker.C():
				p.report(now)
			}
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// syncWriter serializes writes: a command's progress lines come from another goroutine than
// its other output.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func newSyncWriter(w io.Writer) io.Writer {
	if s, ok := w.(*syncWriter); ok {
		return s
	}
	return &syncWriter{w: w}
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
