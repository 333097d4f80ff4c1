package azure

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"

	"github.com/openconstellation/constellation/internal/retry"
)

// Kinds of Azure failures the provider names to the user, each with what to do about it.
var (
	// ErrAuth: no credential, or Azure refused it, or the identity lacks a permission.
	ErrAuth = errors.New("the credentials, or their permissions, were refused")
	// ErrQuota: the subscription's quota (cores of the VM family, public addresses) is used up.
	ErrQuota = errors.New("an Azure quota is exhausted")
	// ErrCapacity: Azure has no capacity for the VM size in the location now.
	ErrCapacity = errors.New("no capacity for the VM size in the location now")
	// ErrUnsupported: the VM size, or confidential VMs, are not offered in the location or
	// subscription.
	ErrUnsupported = errors.New("the VM size or confidential VMs are not offered here")
	// ErrConflict: a resource exists that the provider may not adopt, or Azure refused a
	// change of it.
	ErrConflict = errors.New("an Azure resource is in the way")
)

// hints say what to do about each kind.
var hints = map[error]string{
	ErrAuth: "sign in (az login, or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, or a managed identity) " +
		"with an identity that may create resources and role assignments in the resource group (Contributor and " +
		"User Access Administrator, or Owner); docs/azure.md \"Credentials\"",
	ErrQuota:       "request more quota for the VM family in the location, or use fewer or smaller nodes; docs/azure.md \"Quotas\"",
	ErrCapacity:    "retry later, or choose another location or VM size; what was created so far is kept and a rerun continues",
	ErrUnsupported: "choose a location and a VM size of the variant's family that the subscription offers (az vm list-skus -l LOCATION --size Standard_DC); docs/azure.md \"VM sizes\"",
}

// codeKinds map Azure's error codes to the kinds.
var codeKinds = map[string]error{
	"AuthorizationFailed":                    ErrAuth,
	"AuthenticationFailed":                   ErrAuth,
	"InvalidAuthenticationToken":             ErrAuth,
	"InvalidAuthenticationTokenTenant":       ErrAuth,
	"LinkedAuthorizationFailed":              ErrAuth,
	"SubscriptionNotFound":                   ErrAuth,
	"QuotaExceeded":                          ErrQuota,
	"OperationNotAllowed":                    ErrQuota, // Azure's code for "exceeds approved quota"
	"PublicIPCountLimitReached":              ErrQuota,
	"AllocationFailed":                       ErrCapacity,
	"ZonalAllocationFailed":                  ErrCapacity,
	"OverconstrainedAllocationRequest":       ErrCapacity,
	"OverconstrainedZonalAllocationRequest":  ErrCapacity,
	"SkuNotAvailable":                        ErrUnsupported,
	"InvalidParameter":                       nil, // refined by message: see kindOf
	"BadRequest":                             nil,
	"LocationNotAvailableForResourceType":    ErrUnsupported,
	"NoRegisteredProviderFound":              ErrUnsupported,
	"MissingSubscriptionRegistration":        ErrUnsupported,
	"ConfidentialVMNotSupported":             ErrUnsupported,
	"UnsupportedSecurityTypeForVMSize":       ErrUnsupported,
	"VMSizeNotSupportedForConfidentialVM":    ErrUnsupported,
	"InUseSubnetCannotBeDeleted":             ErrConflict,
	"ResourceGroupBeingDeleted":              ErrConflict,
	"PropertyChangeNotAllowed":               ErrConflict,
	"ConflictingUserInput":                   ErrConflict,
	"NicReservedForAnotherVm":                ErrConflict,
	"OperationNotAllowedOnVMImageAsVMsBeing": ErrConflict,
}

// Error is a failed Azure call: what the provider was doing, the kind of failure when it is
// one the user can act on, and Azure's error. It is transient (internal/retry) when Azure
// throttled or failed on its side, and then says how long Azure asked to wait.
type Error struct {
	// What the provider was doing ("create virtual network mini-vnet").
	What string
	// Kind is one of the Err* kinds, or nil.
	Kind error
	// Code and Status are Azure's error code and HTTP status; 0/"" if Azure did not answer.
	Code   string
	Status int
	// Err is the SDK's error.
	Err error

	retryAfter time.Duration
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("Azure: %s: %v", e.What, oneLine(e.Err))
	if e.Kind != nil {
		msg = fmt.Sprintf("Azure: %s: %v: %v", e.What, e.Kind, oneLine(e.Err))
		if h := hints[e.Kind]; h != "" {
			msg += " (" + h + ")"
		}
	}
	return msg
}

// Unwrap lets errors.Is find the kind and the SDK's error.
func (e *Error) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// Transient implements internal/retry's classification: throttling and Azure's own failures
// are retried; everything else is for the user.
func (e *Error) Transient() bool {
	switch e.Status {
	case http.StatusTooManyRequests, http.StatusRequestTimeout, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	if e.Status == 0 && e.Code == "" {
		return retry.Transient(e.Err) // no answer from Azure: the network's kind decides
	}
	return e.Kind == nil && e.Code == "RetryableError"
}

// RetryAfter is the wait Azure asked for (Retry-After), 0 if none.
func (e *Error) RetryAfter() time.Duration { return e.retryAfter }

// explain wraps err of the call what as an *Error; nil stays nil.
func explain(what string, err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	e := &Error{What: what, Err: err}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		e.Code, e.Status = re.ErrorCode, re.StatusCode
		e.Kind = kindOf(re)
		if re.RawResponse != nil {
			e.retryAfter = retryAfter(re.RawResponse.Header)
		}
	}
	// azidentity's errors: a refused credential, one that needs an interactive sign-in, and
	// a chain none of whose credentials is available (its type is unexported; it is
	// NonRetriable and names the credential).
	var failed *azidentity.AuthenticationFailedError
	var required *azidentity.AuthenticationRequiredError
	var nonRetriable interface{ NonRetriable() }
	if errors.As(err, &failed) || errors.As(err, &required) ||
		(errors.As(err, &nonRetriable) && strings.Contains(err.Error(), "Credential")) {
		e.Kind = ErrAuth
	}
	return e
}

func kindOf(re *azcore.ResponseError) error {
	if k := codeKinds[re.ErrorCode]; k != nil {
		return k
	}
	msg := strings.ToLower(re.Error())
	switch {
	case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
		return ErrAuth
	case strings.Contains(msg, "quota"):
		return ErrQuota
	case strings.Contains(msg, "confidential") && (strings.Contains(msg, "not supported") || strings.Contains(msg, "not available")):
		return ErrUnsupported
	}
	return nil
}

// retryAfter reads Retry-After (seconds, or an HTTP date) and Azure's retry-after-ms headers.
func retryAfter(h http.Header) time.Duration {
	if ms, err := strconv.Atoi(h.Get("Retry-After-Ms")); err == nil && ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	v := h.Get("Retry-After")
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// isNotFound says whether Azure answered that the resource does not exist.
func isNotFound(err error) bool {
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusNotFound
}

// oneLine shortens the SDK's multi-line error text (request, response, error body) to its
// code and message.
func oneLine(err error) string {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		msg := re.ErrorCode
		if m := responseMessage(re); m != "" {
			msg += ": " + m
		}
		return fmt.Sprintf("%s (HTTP %d)", msg, re.StatusCode)
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// responseMessage is the message of Azure's error body, from the SDK's text of it.
func responseMessage(re *azcore.ResponseError) string {
	text := re.Error()
	i := strings.Index(text, `"message": "`)
	if i < 0 {
		return ""
	}
	rest := text[i+len(`"message": "`):]
	if j := strings.Index(rest, `"`); j >= 0 {
		return rest[:j]
	}
	return ""
}
