package azure

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func TestSettings(t *testing.T) {
	valid := func() map[string]any {
		return map[string]any{"subscriptionID": testSub, "resourceGroup": "my-cluster_rg(1)", "location": "westeurope"}
	}
	testCases := map[string]struct {
		edit    func(map[string]any)
		v       variant.Variant
		want    map[string]string // field -> message part
		wantGot Settings
	}{
		"defaults for SEV-SNP": {
			v: variant.AzureSEVSNP,
			wantGot: Settings{SubscriptionID: testSub, ResourceGroup: "my-cluster_rg(1)", Location: "westeurope",
				DiskEncryption: "VMGuestStateOnly", StateDiskGiB: 30},
		},
		"a TDX size for TDX":      {v: variant.AzureTDX, edit: func(m map[string]any) { m["vmSize"] = "Standard_EC16eds_v5" }},
		"a v6 SNP size":           {v: variant.AzureSEVSNP, edit: func(m map[string]any) { m["vmSize"] = "Standard_DC8as_v6" }},
		"disk with guest state":   {v: variant.AzureSEVSNP, edit: func(m map[string]any) { m["diskEncryption"] = "DiskWithVMGuestState" }},
		"an SNP size for TDX":     {v: variant.AzureTDX, edit: func(m map[string]any) { m["vmSize"] = "Standard_DC4as_v5" }, want: map[string]string{"vmSize": "not a confidential VM size of azure-tdx"}},
		"a non-confidential size": {v: variant.AzureSEVSNP, edit: func(m map[string]any) { m["vmSize"] = "Standard_D4s_v5" }, want: map[string]string{"vmSize": "not a confidential VM size"}},
		"missing everything": {
			v: variant.AzureSEVSNP, edit: func(m map[string]any) { clear(m) },
			want: map[string]string{"subscriptionID": "not a subscription ID", "resourceGroup": "not a resource group name", "location": "not an Azure location"},
		},
		"bad values": {
			v: variant.AzureSEVSNP,
			edit: func(m map[string]any) {
				m["subscriptionID"], m["resourceGroup"], m["location"] = "my-sub", "rg.", "West Europe"
				m["diskEncryption"], m["stateDiskGiB"] = "NonPersistedTPM", 5000
			},
			want: map[string]string{
				"subscriptionID": `"my-sub" is not a subscription ID`, "resourceGroup": "not ending in '.'",
				"location": `"West Europe" is not an Azure location`, "diskEncryption": "want VMGuestStateOnly or DiskWithVMGuestState",
				"stateDiskGiB": "5000: want 1 to 4095",
			},
		},
		"unknown field": {v: variant.AzureSEVSNP, edit: func(m map[string]any) { m["vmsize"] = "x" }, want: map[string]string{"vmsize": "unknown field"}},
		"wrong type":    {v: variant.AzureSEVSNP, edit: func(m map[string]any) { m["secureBoot"] = "yes" }, want: map[string]string{"secureBoot": "must be true or false"}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			raw := valid()
			if tc.edit != nil {
				tc.edit(raw)
			}
			problems := ConfigRules{}.CheckSettings(raw, tc.v)
			got := map[string]string{}
			for _, p := range problems {
				got[p.Path] = p.Err.Error()
			}
			require.Len(t, got, len(tc.want), "%v", got)
			for field, msg := range tc.want {
				assert.Contains(t, got[field], msg, field)
			}
			if tc.wantGot != (Settings{}) {
				s, fes := ParseSettings(raw)
				require.Empty(t, fes)
				assert.Equal(t, tc.wantGot, s)
			}
		})
	}
}

// TestConfigValidate checks an Azure configuration through the configuration's own
// validation, as the CLI does: the variants the provider offers, the settings' paths, the
// node network. (The variants' hardware blocks, snp and tdx, are the attestation catalog's
// and left out here.)
func TestConfigValidate(t *testing.T) {
	config.RegisterProvider(Name, ConfigRules{})
	problems := func(c *config.Config) map[string]string {
		out := map[string]string{}
		for _, fe := range strictyaml.FieldErrors(c.Validate()) {
			if fe.Path != "attestation.azureSEVSNP.snp" && fe.Path != "attestation.azureTDX.tdx" {
				out[fe.Path] = fe.Err.Error()
			}
		}
		return out
	}
	assert.Empty(t, problems(testConfig(variant.AzureSEVSNP)))
	assert.Empty(t, problems(testConfig(variant.AzureTDX)), "TDX nodes get a TDX size by default")

	got := problems(testConfig(variant.AzureTrustedLaunch))
	assert.Contains(t, got["attestation.azureTrustedLaunch"], "does not match the provider's nodes, which attest with azure-sev-snp (attestation.azureSEVSNP) or azure-tdx (attestation.azureTDX)")

	c := testConfig(variant.AzureTDX)
	c.Provider.Block().Settings["vmSize"] = "Standard_DC4as_v5"
	assert.Equal(t, map[string]string{"provider.azure.settings.vmSize": `"Standard_DC4as_v5" is not a confidential VM size of azure-tdx (for example Standard_DC4es_v5)`}, problems(c))

	c = testConfig(variant.AzureSEVSNP)
	c.Network.PodCIDR = "10.244.0.0/24"
	assert.Equal(t, map[string]string{"network.podCIDR": "pod network 10.244.0.0/24 holds 1 node networks (/24), not one for slot 1: the cluster has 2 nodes"}, problems(c))

	c = testConfig(variant.AzureSEVSNP)
	c.Network.PodCIDR = "10.9.128.0/17"
	assert.Contains(t, problems(c)["network.podCIDR"], "overlaps the Azure provider's node network 10.9.0.0/16")
}
