//go:build !talos_v1_14

package main

import (
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
)

// oracleName is what the binary calls itself in its errors (scripts/tools.sh builds it per contract).
const oracleName = "talos-oracle-v1.13"

// cniOptions: machinery v1.13's v1alpha1 CNI block, `none` (Talos installs no CNI) or `custom` with
// manifest URLs.
func cniOptions(g *generateInput) ([]generate.Option, error) {
	if g.CNIName == "" {
		return nil, nil
	}

	return []generate.Option{generate.WithClusterCNIConfig(&v1alpha1.CNIConfig{CNIName: g.CNIName, CNIUrls: g.CNIURLs})}, nil
}
