package nodeauthz

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coordinationv1ac "k8s.io/client-go/applyconfigurations/coordination/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/pkg/untrusted"
)

// The authorizer's readiness, and where the operator's CLI sees it.
//
// The authorizer fails open: while it is down or not synced the API server decides node
// requests without it. That must not go unnoticed, so readiness is part of a control plane's
// health (`constellation status`, and the waits of init and apply). The CLI cannot reach the
// authorizer (it listens on each control plane's loopback, where only that control plane's API
// server asks it), so each control plane's bootstrapper reports it into the cluster:
//
//   - the authorizer answers GET ReadyPath: 200 "synced" once it has listed the removal
//     records, 503 with the reason before;
//   - Start's reporter asks that endpoint every probeInterval, over TLS at the address the API
//     server uses and with the certificate check the API server makes, and writes the answer
//     into the Lease ReportName(node) in ReportNamespace: renewed every ReportInterval, at once
//     when the answer changes. A report older than its lease duration is stale: the
//     bootstrapper that would renew it is down, and the authorizer with it.
const (
	// ReadyPath is the authorizer's readiness endpoint.
	ReadyPath = "/readyz"
	// ReportNamespace holds the reports: the cluster's own namespace, written by the control
	// planes' admin credentials only.
	ReportNamespace = "kube-system"
	// ReportComponent is the reports' app.kubernetes.io/component label.
	ReportComponent = "removed-node-authorizer"
	// ReadyAnnotation is "true" when the authorizer answered synced; DetailAnnotation says
	// what it answered.
	ReadyAnnotation  = "constellation.openconstellation.dev/nodeauthz-ready"
	DetailAnnotation = "constellation.openconstellation.dev/nodeauthz-detail"
	// ReportInterval is how often a report is renewed; ReportDuration how long one holds.
	ReportInterval = 10 * time.Second
	ReportDuration = 40 * time.Second

	reportPrefix   = "constellation-nodeauthz-"
	componentLabel = "app.kubernetes.io/component"
	fieldManager   = "constellation-nodeauthz"
	probeInterval  = time.Second
	probeTimeout   = 2 * time.Second
	// maxDetail bounds what a report says.
	maxDetail = 256
)

// ReportName is the name of node's report.
func ReportName(node string) string { return reportPrefix + node }

// Readiness is what the authorizer's readiness endpoint answered.
type Readiness struct {
	Ready  bool
	Detail string
}

// probe asks the readiness endpoint at addr with client.
func probe(ctx context.Context, client *http.Client, addr string) Readiness {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+ReadyPath, nil)
	if err != nil {
		return Readiness{Detail: err.Error()}
	}
	resp, err := client.Do(req)
	if err != nil {
		return Readiness{Detail: "not serving: " + err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxDetail))
	detail := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return Readiness{Detail: fmt.Sprintf("%s (HTTP %d)", detail, resp.StatusCode)}
	}
	return Readiness{Ready: true, Detail: detail}
}

// report probes the authorizer at addr (its serving certificate checked against ca) and keeps
// node's report up to date until ctx ends. Failures to write are logged when they start or
// change, and retried at the next probe.
func report(ctx context.Context, client kubernetes.Interface, node, addr string, ca *x509.Certificate, log *slog.Logger, now func() time.Time) {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	prober := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}}}
	defer prober.CloseIdleConnections()
	var (
		written   Readiness
		writtenAt time.Time
		lastErr   string
	)
	ticker := time.NewTicker(probeInterval)
	defer ticker.Stop()
	for {
		r := probe(ctx, prober, addr)
		if ctx.Err() != nil {
			return
		}
		if t := now(); writtenAt.IsZero() || r != written || t.Sub(writtenAt) >= ReportInterval {
			err := writeReport(ctx, client, node, r, t)
			switch {
			case err == nil:
				if lastErr != "" || writtenAt.IsZero() || r.Ready != written.Ready {
					log.Info("removed-node authorizer readiness reported", "ready", r.Ready, "detail", r.Detail)
				}
				written, writtenAt, lastErr = r, t, ""
			case err.Error() != lastErr && ctx.Err() == nil:
				lastErr = err.Error()
				log.Warn("reporting the removed-node authorizer's readiness", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// writeReport writes node's report (server-side apply: one request, whether it exists or not).
func writeReport(ctx context.Context, client kubernetes.Interface, node string, r Readiness, at time.Time) error {
	detail := r.Detail
	if len(detail) > maxDetail {
		detail = detail[:maxDetail]
	}
	lease := coordinationv1ac.Lease(ReportName(node), ReportNamespace).
		WithLabels(map[string]string{componentLabel: ReportComponent, "app.kubernetes.io/part-of": "constellation"}).
		WithAnnotations(map[string]string{ReadyAnnotation: strconv.FormatBool(r.Ready), DetailAnnotation: detail}).
		WithSpec(coordinationv1ac.LeaseSpec().
			WithHolderIdentity(node).
			WithLeaseDurationSeconds(int32(ReportDuration / time.Second)).
			WithRenewTime(metav1.NewMicroTime(at)))
	_, err := client.CoordinationV1().Leases(ReportNamespace).Apply(ctx, lease, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("writing lease %s/%s: %w", ReportNamespace, ReportName(node), err)
	}
	return nil
}

// Report is a control plane's report of its authorizer, as read from the cluster.
type Report struct {
	Node      string
	Ready     bool
	Detail    string
	RenewedAt time.Time
	// Duration is how long the report holds after RenewedAt.
	Duration time.Duration
}

// Reports reads every control plane's report, by node name. Leases with the label that are not
// well-formed reports are skipped: they report nothing.
func Reports(ctx context.Context, client kubernetes.Interface) (map[string]Report, error) {
	list, err := client.CoordinationV1().Leases(ReportNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{componentLabel: ReportComponent}.String(),
	})
	if err != nil {
		return nil, fmt.Errorf("reading the removed-node authorizers' reports: %w", err)
	}
	out := map[string]Report{}
	for i := range list.Items {
		if r, ok := parseReport(&list.Items[i]); ok {
			out[r.Node] = r
		}
	}
	return out, nil
}

func parseReport(l *coordinationv1.Lease) (Report, bool) {
	node, ok := strings.CutPrefix(l.Name, reportPrefix)
	if !ok || node == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		return Report{}, false
	}
	return Report{
		Node:      node,
		Ready:     l.Annotations[ReadyAnnotation] == "true",
		Detail:    untrusted.Text(l.Annotations[DetailAnnotation]),
		RenewedAt: l.Spec.RenewTime.Time,
		Duration:  time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second,
	}, true
}

// Health is a control plane's authorizer as its report says.
type Health struct {
	// Ready: a fresh report says synced.
	Ready bool
	// Reported: there is a report, fresh or not. A control plane without one has not
	// started its authorizer yet, or boots an image from before the reports.
	Reported bool
	// Why says what the report says, or why there is none.
	Why string
}

// Assess says whether node's authorizer is ready at now, as reports (Reports) say, and why
// not: no report, a stale report (its bootstrapper is down), or the authorizer's own answer.
func Assess(reports map[string]Report, node string, now time.Time) Health {
	r, ok := reports[node]
	switch {
	case !ok:
		return Health{Why: "no report (its bootstrapper has not started it, or boots an image from before the reports)"}
	case now.Sub(r.RenewedAt) > r.Duration:
		return Health{Reported: true, Why: fmt.Sprintf("its last report is %s old (reports hold %s): the bootstrapper that serves it is down", now.Sub(r.RenewedAt).Round(time.Second), r.Duration)}
	case !r.Ready && r.Detail == "":
		return Health{Reported: true, Why: "reported not ready"}
	case !r.Ready:
		return Health{Reported: true, Why: r.Detail}
	}
	return Health{Ready: true, Reported: true, Why: r.Detail}
}

// DeleteReport deletes node's report: a removed control plane reports nothing any more. A
// report that is gone is no error.
func DeleteReport(ctx context.Context, client kubernetes.Interface, node string) error {
	err := client.CoordinationV1().Leases(ReportNamespace).Delete(ctx, ReportName(node), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the removed-node authorizer's report of %s: %w", node, err)
	}
	return nil
}
