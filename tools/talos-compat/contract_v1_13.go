//go:build !talos_v1_14

package main

import (
	"context"

	"github.com/cosi-project/runtime/pkg/resource/meta"

	"github.com/siderolabs/talos/pkg/machinery/client"
)

// bootIDResource: v1.13 has no BootID resource; talosctl reads /proc/sys/kernel/random/boot_id.
func bootIDResource(context.Context, *client.Client) (string, bool, error) {
	return "", false, nil
}

// extraDefinitions: the resource types of this contract only (none on v1.13).
func extraDefinitions() meta.ResourceDefinitionProvider {
	return nil
}
