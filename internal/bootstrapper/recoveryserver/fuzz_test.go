package recoveryserver_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/api/recover/recoverpb"
	"github.com/openconstellation/constellation/internal/bootstrapper/recoveryserver"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/statedisk"
)

// FuzzCheckRequest feeds the check of a Recover request with arbitrary wire bytes (what
// anyone who reaches the port can send). Property: no panic, and whatever is accepted has
// the sizes the key check and the cluster ID derivation rely on.
func FuzzCheckRequest(f *testing.F) {
	k := bytes.Repeat([]byte{1}, 32)
	for _, req := range []*recoverpb.RecoverRequest{
		{StateDiskKey: k, MeasurementSecret: k, MeasurementSalt: k},
		{StateDiskKey: k[:31], MeasurementSecret: append(k, 0), MeasurementSalt: nil},
		{},
	} {
		seed, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req recoverpb.RecoverRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		if recoveryserver.CheckRequest(&req) != nil {
			return
		}
		if len(req.StateDiskKey) != statedisk.KeySize || len(req.MeasurementSecret) != kms.DerivedKeySize || len(req.MeasurementSalt) != recoveryserver.MeasurementSaltSize {
			t.Fatalf("accepted a request with sizes %d, %d, %d", len(req.StateDiskKey), len(req.MeasurementSecret), len(req.MeasurementSalt))
		}
		if _, err := kms.ClusterID(req.MeasurementSecret, req.MeasurementSalt); err != nil {
			t.Fatalf("accepted a request whose cluster ID cannot be derived: %v", err)
		}
	})
}
