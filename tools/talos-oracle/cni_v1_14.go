//go:build talos_v1_14

package main

import (
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config/generate"
)

// oracleName is what the binary calls itself in its errors (scripts/tools.sh builds it per contract).
const oracleName = "talos-oracle-v1.14"

// cniOptions: machinery v1.14 takes one custom CNI manifest URL (a KubeExternalManifestConfig named
// custom-cni, and no KubeFlannelCNIConfig) and has no `none`: the caller patches that form in.
func cniOptions(g *generateInput) ([]generate.Option, error) {
	switch g.CNIName {
	case "":
		return nil, nil
	case "custom":
		if len(g.CNIURLs) != 1 {
			return nil, fmt.Errorf("machinery v1.14 generates one custom CNI URL, not %d", len(g.CNIURLs))
		}

		return []generate.Option{generate.WithCustomCNIUrl(g.CNIURLs[0])}, nil
	}

	return nil, fmt.Errorf("machinery v1.14 has no CNI option %q (only a custom URL)", g.CNIName)
}
