package eventlog_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"

	pb "github.com/google/go-eventlog/proto/state"
	"github.com/google/go-eventlog/tcg"
	eltestdata "github.com/google/go-eventlog/testdata"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	tpmpb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/google/go-tpm-tools/quote"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
)

func hexPCRs(t testing.TB, in map[uint32]string) map[uint32][]byte {
	out := map[uint32][]byte{}
	for i, h := range in {
		b, err := hex.DecodeString(h)
		require.NoError(t, err)
		out[i] = b
	}
	return out
}

// realLogs are firmware event logs of real machines with their SHA-256 PCR values, from
// go-eventlog's test data.
func realLogs(t testing.TB) []struct {
	name string
	log  []byte
	pcrs map[uint32][]byte
	tech pb.GCEConfidentialTechnology
} {
	return []struct {
		name string
		log  []byte
		pcrs map[uint32][]byte
		tech pb.GCEConfidentialTechnology
	}{
		{"rhel8 GCE", eltestdata.Rhel8EventLog, hexPCRs(t, map[uint32]string{
			0:  "24af52a4f429b71a3184a6d64cddad17e54ea030e2aa6576bf3a5a3d8bd3328f",
			1:  "454220afaa80c83c3839f6cccd8b3c88bf4f562316a9dda1121c578c9e005a53",
			2:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			3:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			4:  "758a3d35f1b0ff5b135dacd07db0c8132c0ac665d944090d4bf96e66447a245c",
			5:  "53d0ee36163219201e686167bbb71ec505b3ba2917b9d9183ed84aad26cfeb89",
			6:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			7:  "5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da",
			8:  "25c3874041ebd4e9a21b6ed71b624a7bfa99907a8dcea7f129a4c64cbaf5829a",
			9:  "d43b2f61eb18b4791812ff5f20ab20e4ef621ba683370bedf5dbdf518b3a8078",
			14: "d8f57ebcc1a23cc46832696e1a657f720e1be8f5b405bb7204682114e363b455",
		}), pb.GCEConfidentialTechnology_NONE},
		{"ubuntu 18.04 GCE AMD SEV", eltestdata.Ubuntu1804AmdSevEventLog, hexPCRs(t, map[uint32]string{
			0: "0f35c214608d93c7a6e68ae7359b4a8be5a0e99eea9107ece427c4dea4e439cf",
			1: "add81cbc06b154716ac7bd5999c84cbc520184d57c58102657d270274508d9ce",
			2: "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			3: "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			4: "b4b94e840fc9352e20bdb5b456b4c242af0fb146755b6935d8eda000ea368a31",
			5: "0b75168095fd6464ff1f9943b762ec009a3ae84c5e76cf67361e16b9db30d28e",
			6: "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			7: "61af3f499f1a86be54458fd30d193fa913a7e23ca3103fa3d0abaefd3cd4f9b8",
			8: "c324da9d0c54252c37af697cdd58b066f2bb0f4a69752d27623bc738d02e9486",
			9: "2d334f1eeb9a16dabaccaa746ff1c0dce2e9aeb3f3a4a314e5e1e61b01e940d0",
		}), pb.GCEConfidentialTechnology_AMD_SEV},
		{"ubuntu 24.04 GCE AMD SEV-SNP", eltestdata.Ubuntu2404AmdSevSnpEventLog, hexPCRs(t, map[uint32]string{
			0:  "50597a27846e91d025eef597abbc89f72bff9af849094db97b0684d8bc4c515e",
			1:  "57344e1cc8c6619413df33013a7cd67915459f967395af41db21c1fa7ca9c307",
			2:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			3:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			4:  "abe8b3fa6aecb36c2fd93c6f6edde661c21b353d007410a2739d69bfa7e1b9be",
			5:  "0b0e1903aeb1bff649b82dba2cdcf5c4ffb75027e54f151ab00b3b989f16a300",
			6:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			7:  "33ad69850fb2c7f30b4f8b4bc10ed93fc954dc07fa726e84f50f3d192dc1c140",
			8:  "6932a3f71dc55ad3c1a6ac2196eeac26a1b7164b6bbfa106625d94088ec3ecc3",
			9:  "ce08798b283c7a0ddc5e9ad1d602304b945b741fc60c20e254eafa0f4782512b",
			14: "306f9d8b94f17d93dc6e7cf8f5c79d652eb4c6c4d13de2dddc24af416e13ecaf",
		}), pb.GCEConfidentialTechnology_AMD_SEV_SNP},
	}
}

func TestReplayRealLogs(t *testing.T) {
	for _, tc := range realLogs(t) {
		t.Run(tc.name, func(t *testing.T) {
			log, err := eventlog.Replay(tc.log, tc.pcrs)
			require.NoError(t, err)
			assert.NotEmpty(t, log.Events())
			platform, err := log.Platform()
			require.NoError(t, err)
			assert.Equal(t, tc.tech, platform.GetTechnology())
		})
	}
}

// gceAttestation is a real GCE attestation: its SHA-256 quote verifies with its AK for nonce
// 90 09, so its PCR values are what a real vTPM signed.
func gceAttestation(t testing.TB) (log []byte, pcrs map[uint32][]byte) {
	raw, err := os.ReadFile("testdata/gce-cos-85-nonce9009.pb")
	require.NoError(t, err)
	att := &attestpb.Attestation{}
	require.NoError(t, proto.Unmarshal(raw, att))
	pub, err := tpm2.DecodePublic(att.GetAkPub())
	require.NoError(t, err)
	key, err := pub.Key()
	require.NoError(t, err)
	for _, q := range att.GetQuotes() {
		if q.GetPcrs().GetHash() != tpmpb.HashAlgo_SHA256 {
			continue
		}
		require.NoError(t, quote.Verify(q, key, []byte{0x90, 0x09}), "the sample's quote must verify")
		return att.GetEventLog(), q.GetPcrs().GetPcrs()
	}
	t.Fatal("no SHA-256 quote in the sample")
	return nil, nil
}

func TestReplayQuotedGCEAttestation(t *testing.T) {
	raw, pcrs := gceAttestation(t)
	require.Len(t, pcrs, 24)
	log, err := eventlog.Replay(raw, pcrs)
	require.NoError(t, err)
	platform, err := log.Platform()
	require.NoError(t, err)
	assert.Equal(t, pb.GCEConfidentialTechnology_AMD_SEV, platform.GetTechnology())
}

// findEvent returns the first event of typ in pcr.
func findEvent(t testing.TB, raw []byte, pcrs map[uint32][]byte, pcr uint32, typ tcg.EventType) eventlog.Event {
	log, err := eventlog.Replay(raw, pcrs)
	require.NoError(t, err)
	for _, e := range log.Events() {
		if e.PCR == pcr && e.Type == typ {
			return e
		}
	}
	t.Fatalf("no %s event in PCR %d", typ, pcr)
	return eventlog.Event{}
}

func TestReplayRejectsTampering(t *testing.T) {
	raw, pcrs := gceAttestation(t)

	testCases := map[string]struct {
		tamper  func(log []byte, pcrs map[uint32][]byte)
		wantErr string
	}{
		"one quoted PCR value": {
			tamper:  func(_ []byte, pcrs map[uint32][]byte) { pcrs[4][0] ^= 1 },
			wantErr: "does not replay to the quoted value of PCR 4",
		},
		"one event digest": {
			tamper: func(log []byte, pcrs map[uint32][]byte) {
				e := findEvent(t, raw, pcrs, 7, tcg.EFIVariableDriverConfig)
				i := bytes.Index(log, e.Digest)
				require.Positive(t, i)
				log[i] ^= 1
			},
			wantErr: "does not replay to the quoted value of PCR 7",
		},
		"one event's data (an EFI action)": {
			tamper: func(log []byte, pcrs map[uint32][]byte) {
				e := findEvent(t, raw, pcrs, 4, tcg.EFIAction)
				i := bytes.Index(log, e.Data)
				require.Positive(t, i)
				log[i] ^= 0x20 // "Calling ..." -> "calling ..."
			},
			wantErr: "PCR 4, EV_EFI_ACTION): data does not match its digest",
		},
		"one event moved to another PCR": {
			tamper: func(log []byte, pcrs map[uint32][]byte) {
				e := findEvent(t, raw, pcrs, 4, tcg.EFIAction)
				i := bytes.Index(log, e.Digest)
				// Header: PCR index (4), type (4), digest count (4), then SHA-1 first: the
				// SHA-1 digest (20) and its algorithm ID (2) precede the SHA-256 one.
				hdr := i - 2 - 20 - 2 - 4 - 4 - 4
				require.Equal(t, byte(4), log[hdr])
				log[hdr] = 5
			},
			wantErr: "does not replay to the quoted value of PCRs [4 5]",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			log := bytes.Clone(raw)
			quoted := map[uint32][]byte{}
			for i, v := range pcrs {
				quoted[i] = bytes.Clone(v)
			}
			tc.tamper(log, quoted)
			_, err := eventlog.Replay(log, quoted)
			require.ErrorIs(t, err, attestation.ErrMalformed)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestReplayRejectsMalformed(t *testing.T) {
	extend := func(pcrs map[uint32][]byte, pcr uint32, d [32]byte) {
		v := sha256.Sum256(append(bytes.Clone(pcrs[pcr]), d[:]...))
		pcrs[pcr] = v[:]
	}
	zero := func() map[uint32][]byte {
		m := map[uint32][]byte{}
		for i := range uint32(eventlog.NumPCRs) {
			m[i] = make([]byte, 32)
		}
		return m
	}

	testCases := map[string]struct {
		build   func() ([]byte, map[uint32][]byte)
		wantErr string
	}{
		"empty": {
			build:   func() ([]byte, map[uint32][]byte) { return nil, zero() },
			wantErr: "empty event log",
		},
		"truncated": {
			build: func() ([]byte, map[uint32][]byte) {
				b := eventlog.NewBuilder()
				b.Add(4, tcg.EFIAction, []byte("x"))
				raw := b.Bytes()
				return raw[:len(raw)-3], zero()
			},
			wantErr: "event log",
		},
		"unknown event type that replays": {
			build: func() ([]byte, map[uint32][]byte) {
				pcrs := zero()
				b := eventlog.NewBuilder()
				extend(pcrs, 8, b.Add(8, tcg.EventType(0x7fff0001), []byte("?")))
				return b.Bytes(), pcrs
			},
			wantErr: "unknown type 0x7fff0001",
		},
		"event for a PCR the quote does not cover": {
			build: func() ([]byte, map[uint32][]byte) {
				pcrs := zero()
				delete(pcrs, 9)
				b := eventlog.NewBuilder()
				b.Add(9, tcg.EventTag, []byte("x"))
				return b.Bytes(), pcrs
			},
			wantErr: "events for PCR 9, which the quote does not cover",
		},
		"event for PCR 24": {
			build: func() ([]byte, map[uint32][]byte) {
				b := eventlog.NewBuilder()
				b.Add(24, tcg.EventTag, []byte("x"))
				return b.Bytes(), zero()
			},
			wantErr: "names PCR 24",
		},
		"SHA-1 only log": {
			build:   func() ([]byte, map[uint32][]byte) { return eltestdata.Debian10EventLog, zero() },
			wantErr: "no SHA-256 digests",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			raw, pcrs := tc.build()
			_, err := eventlog.Replay(raw, pcrs)
			require.ErrorIs(t, err, attestation.ErrMalformed)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestBuilderReplays(t *testing.T) {
	pcrs := map[uint32][]byte{}
	for i := range uint32(eventlog.NumPCRs) {
		pcrs[i] = make([]byte, 32)
	}
	b := eventlog.NewBuilder()
	for _, e := range []struct {
		pcr  uint32
		data string
	}{{11, "bootstrapper"}, {12, "node config"}, {11, "second component"}} {
		d := b.Add(e.pcr, tcg.Ipl, []byte(e.data))
		v := sha256.Sum256(append(bytes.Clone(pcrs[e.pcr]), d[:]...))
		pcrs[e.pcr] = v[:]
	}
	log, err := eventlog.Replay(b.Bytes(), pcrs)
	require.NoError(t, err)
	events := log.Events()
	require.Len(t, events, 3)
	assert.Equal(t, uint32(12), events[1].PCR)
	assert.Equal(t, "node config", string(events[1].Data))
}

// BenchmarkReplay replays a real GCE firmware log (about 24 KiB, quoted PCRs): the cost the
// cloud variants add to every validation.
func BenchmarkReplay(b *testing.B) {
	raw, pcrs := gceAttestation(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := eventlog.Replay(raw, pcrs); err != nil {
			b.Fatal(err)
		}
	}
}
