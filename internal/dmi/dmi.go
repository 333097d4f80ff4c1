// Package dmi reads the machine's firmware identity (SMBIOS, as the kernel exports it under
// /sys/class/dmi/id): who made the machine, what it is, and its chassis asset tag. The node
// program tells by it which platform it runs on (internal/provider/catalog/nodes).
//
// The hypervisor writes these strings: they pick which platform's conventions a node follows
// (where its metadata is, which disk is its state disk), never what it trusts. A node's
// evidence comes from its TPM and its CPU, whatever DMI says (docs/threat-model.md).
package dmi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Dir is where the kernel exports the machine's DMI facts.
const Dir = "/sys/class/dmi/id"

// Info is a machine's firmware identity. A field the firmware does not set is "".
type Info struct {
	SysVendor       string // sys_vendor: "QEMU", "Microsoft Corporation", ...
	ProductName     string // product_name: "Standard PC (Q35 + ICH9, 2009)", "Virtual Machine", ...
	ChassisAssetTag string // chassis_asset_tag: Azure's VMs carry one of their own
}

// Read reads the DMI facts under dir (Dir on a machine). A machine without DMI (no dir) is an
// error; a file that is missing leaves its field "".
func Read(dir string) (Info, error) {
	if _, err := os.Stat(dir); err != nil {
		return Info{}, fmt.Errorf("reading the machine's DMI facts: %w", err)
	}
	var info Info
	for name, field := range map[string]*string{
		"sys_vendor": &info.SysVendor, "product_name": &info.ProductName, "chassis_asset_tag": &info.ChassisAssetTag,
	} {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return Info{}, fmt.Errorf("reading the machine's DMI facts: %w", err)
		}
		*field = strings.TrimSpace(string(raw))
	}
	return info, nil
}

// String names the facts a platform is told by, for logs and errors.
func (i Info) String() string {
	return fmt.Sprintf("sys_vendor %q, product_name %q, chassis_asset_tag %q", i.SysVendor, i.ProductName, i.ChassisAssetTag)
}
