//go:build talos_v1_14

package main

import (
	"context"

	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"

	"github.com/siderolabs/talos/pkg/machinery/client"
	talosruntime "github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// bootIDResource: v1.14's BootID resource, what its talosctl compares across a reboot.
func bootIDResource(ctx context.Context, cli *client.Client) (string, bool, error) {
	res, err := safe.StateGetByID[*talosruntime.BootID](ctx, cli.COSI, talosruntime.BootIDID)
	if err != nil {
		return "", false, err
	}

	return res.TypedSpec().BootID, true, nil
}

// extraDefinitions: the resource types of this contract only.
func extraDefinitions() meta.ResourceDefinitionProvider {
	return &talosruntime.BootID{}
}
