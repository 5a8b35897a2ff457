package main

import (
	_ "unsafe" // go:linkname

	coreconfig "github.com/siderolabs/talos/pkg/machinery/config/config"

	_ "github.com/siderolabs/talos/pkg/machinery/config/types" // every document kind registers itself
)

// registeredKinds is machinery's registry.Kinds: every document kind Talos's decoder knows. The registry is
// an internal package, so the schema case reaches it by name (registry_kinds.s lets this body be absent).
//
//go:linkname registeredKinds github.com/siderolabs/talos/pkg/machinery/config/internal/registry.Kinds
func registeredKinds() []string

// registryNew is machinery's registry.New: the empty document of a kind, as the decoder makes it before decoding.
//
//go:linkname registryNew github.com/siderolabs/talos/pkg/machinery/config/internal/registry.New
func registryNew(kind, version string) (coreconfig.Document, error)
