// talos-oracle: Talos's own configuration code (github.com/siderolabs/talos/pkg/machinery) as the
// oracle ichord's renderer is tested against (tests/real/test_render_oracle.py), built against the
// machinery version of one Talos contract: scripts/tools.sh builds talos-oracle-v1.13 with go.mod and
// talos-oracle-v1.14 with -modfile=go.v1.14.mod -tags talos_v1_14 (cni_v1_*.go: the one API that differs).
//
// It reads a batch of cases as JSON on stdin and writes one JSON result per case, in order, so one
// run serves hundreds of cases:
//
//	{"cases": [{"id": "...", "generate": {...}} | {"id": "...", "validate": {...}} | {"id": "...", "schema": {...}}]}
//
// generate: what `talosctl gen config` writes for the inputs (secrets bundle, cluster name, endpoint,
// Kubernetes version, role, the gen options ichord maps, then the config patches), without comments,
// and what Talos's validator says of it. validate: Talos's loader and validator on a full
// configuration in the mode of a platform (metal: install required; container). schema: what the
// decoder accepts, type by type (schema.go).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	jsonpatch "github.com/evanphx/json-patch"
	"github.com/siderolabs/talos/pkg/machinery/config"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
)

type batch struct {
	Cases []testCase `json:"cases"`
}

type testCase struct {
	ID       string         `json:"id"`
	Generate *generateInput `json:"generate,omitempty"`
	Validate *validateInput `json:"validate,omitempty"`
	Schema   *schemaInput   `json:"schema,omitempty"`
}

type generateInput struct {
	Contract                       string              `json:"contract"`
	Bundle                         string              `json:"bundle"`
	ClusterName                    string              `json:"clusterName"`
	Endpoint                       string              `json:"endpoint"`
	KubernetesVersion              string              `json:"kubernetesVersion"`
	Role                           string              `json:"role"`
	InstallDisk                    string              `json:"installDisk,omitempty"`
	InstallExtraKernelArgs         []string            `json:"installExtraKernelArgs,omitempty"`
	AdditionalSANs                 []string            `json:"additionalSANs,omitempty"`
	DNSDomain                      string              `json:"dnsDomain,omitempty"`
	AllowSchedulingOnControlPlanes bool                `json:"allowSchedulingOnControlPlanes,omitempty"`
	LocalAPIServerPort             int                 `json:"localAPIServerPort,omitempty"`
	Sysctls                        map[string]string   `json:"sysctls,omitempty"`
	RegistryMirrors                map[string][]string `json:"registryMirrors,omitempty"`
	CNIName                        string              `json:"cniName,omitempty"`
	CNIURLs                        []string            `json:"cniURLs,omitempty"`
	Patches                        []string            `json:"patches,omitempty"`
	// V1Alpha1JSON6902 applies JSON6902 patches to the v1alpha1 document alone, as ichord does: Talos's
	// configpatcher refuses them on any multi-document configuration.
	V1Alpha1JSON6902 bool   `json:"v1alpha1JSON6902,omitempty"`
	Mode             string `json:"mode,omitempty"` // validation mode of the result
}

type validateInput struct {
	Config string `json:"config"`
	Mode   string `json:"mode"`
}

type result struct {
	ID string `json:"id"`
	// Config is the generated configuration (generate only).
	Config string `json:"config,omitempty"`
	// Error is why generating, loading or validating failed; Valid is whether the validator passed.
	Error    string   `json:"error,omitempty"`
	Valid    bool     `json:"valid"`
	Warnings []string `json:"warnings,omitempty"`
	// Schema is what the decoder accepts (schema only; schema.go).
	Schema *schemaOutput `json:"schema,omitempty"`
}

// platformMode is the validation.RuntimeMode of a platform: metal installs to disk, container does not.
type platformMode string

func (m platformMode) String() string        { return string(m) }
func (m platformMode) RequiresInstall() bool { return m == "metal" }
func (m platformMode) InContainer() bool     { return m == "container" }

func parseMode(name string) (platformMode, error) {
	switch name {
	case "", "metal":
		return "metal", nil
	case "container":
		return "container", nil
	}

	return "", fmt.Errorf("unknown validation mode %q (metal, container)", name)
}

func main() {
	var in batch

	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "%s: reading the batch from stdin: %v\n", oracleName, err)
		os.Exit(2)
	}

	tmp, err := os.MkdirTemp("", "talos-oracle-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", oracleName, err)
		os.Exit(2)
	}

	defer os.RemoveAll(tmp) //nolint:errcheck

	out := make([]result, 0, len(in.Cases))

	for i, c := range in.Cases {
		r := result{ID: c.ID}

		switch {
		case c.Generate != nil:
			r = run(c.ID, func() (result, error) { return generateCase(c.Generate, fmt.Sprintf("%s/bundle-%d.yaml", tmp, i)) })
		case c.Validate != nil:
			r = run(c.ID, func() (result, error) { return validateCase(c.Validate.Config, c.Validate.Mode) })
		case c.Schema != nil:
			r = run(c.ID, func() (result, error) { return schemaCase(c.Schema) })
		default:
			r.Error = "the case has neither generate nor validate"
		}

		out = append(out, r)
	}

	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", oracleName, err)
		os.Exit(2)
	}
}

// run calls f; an error (or a panic inside Talos's code) becomes the case's Error.
func run(id string, f func() (result, error)) (r result) {
	defer func() {
		if p := recover(); p != nil {
			r = result{ID: id, Error: fmt.Sprintf("panic: %v", p)}
		}
	}()

	r, err := f()
	r.ID = id

	if err != nil {
		r.Error = err.Error()
		r.Valid = false
	}

	return r
}

func generateCase(g *generateInput, bundlePath string) (result, error) {
	contract, err := config.ParseContractFromVersion(g.Contract)
	if err != nil {
		return result{}, fmt.Errorf("contract: %w", err)
	}

	// LoadBundle reads a file: the bundle is written where only this process reads it.
	if err = os.WriteFile(bundlePath, []byte(g.Bundle), 0o600); err != nil {
		return result{}, err
	}

	bundle, err := secrets.LoadBundle(bundlePath)
	os.Remove(bundlePath) //nolint:errcheck

	if err != nil {
		return result{}, fmt.Errorf("loading the secrets bundle: %w", err)
	}

	opts := []generate.Option{
		generate.WithSecretsBundle(bundle),
		generate.WithVersionContract(contract),
	}

	if g.InstallDisk != "" {
		opts = append(opts, generate.WithInstallDisk(g.InstallDisk))
	}

	if len(g.InstallExtraKernelArgs) > 0 {
		opts = append(opts, generate.WithInstallExtraKernelArgs(g.InstallExtraKernelArgs))
	}

	if len(g.AdditionalSANs) > 0 {
		opts = append(opts, generate.WithAdditionalSubjectAltNames(g.AdditionalSANs))
	}

	if g.DNSDomain != "" {
		opts = append(opts, generate.WithDNSDomain(g.DNSDomain))
	}

	if g.AllowSchedulingOnControlPlanes {
		opts = append(opts, generate.WithAllowSchedulingOnControlPlanes(true))
	}

	if g.LocalAPIServerPort != 0 {
		opts = append(opts, generate.WithLocalAPIServerPort(g.LocalAPIServerPort))
	}

	if len(g.Sysctls) > 0 {
		opts = append(opts, generate.WithSysctls(g.Sysctls))
	}

	// Mirrors in a stable order: the generator emits one document per WithRegistryMirror call.
	hosts := make([]string, 0, len(g.RegistryMirrors))
	for host := range g.RegistryMirrors {
		hosts = append(hosts, host)
	}

	slices.Sort(hosts)

	for _, host := range hosts {
		opts = append(opts, generate.WithRegistryMirror(host, g.RegistryMirrors[host]...))
	}

	cni, err := cniOptions(g)
	if err != nil {
		return result{}, err
	}

	opts = append(opts, cni...)

	input, err := generate.NewInput(g.ClusterName, g.Endpoint, g.KubernetesVersion, opts...)
	if err != nil {
		return result{}, fmt.Errorf("generate input: %w", err)
	}

	var role machine.Type

	switch g.Role {
	case "controlplane":
		role = machine.TypeControlPlane
	case "worker":
		role = machine.TypeWorker
	default:
		return result{}, fmt.Errorf("unknown role %q", g.Role)
	}

	provider, err := input.Config(role)
	if err != nil {
		return result{}, fmt.Errorf("generate: %w", err)
	}

	if len(g.Patches) > 0 {
		provider, err = applyPatches(provider, g.Patches, g.V1Alpha1JSON6902)
		if err != nil {
			return result{}, err
		}
	}

	data, err := provider.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return result{}, fmt.Errorf("encoding: %w", err)
	}

	r, err := validateCase(string(data), g.Mode)
	r.Config = string(data)

	return r, err
}

func applyPatches(provider config.Provider, texts []string, v1alpha1JSON6902 bool) (config.Provider, error) {
	// LoadPatches reads "@file" arguments from disk: an inline patch must not start with '@'.
	for _, text := range texts {
		if strings.HasPrefix(text, "@") {
			return nil, errors.New("a patch starting with '@' would be read as a file name")
		}
	}

	patches, err := configpatcher.LoadPatches(texts)
	if err != nil {
		return nil, fmt.Errorf("loading the patches: %w", err)
	}

	if !v1alpha1JSON6902 {
		return applyTalos(provider, patches)
	}

	// One patch at a time, so the JSON6902 ones can be given the v1alpha1 document alone.
	for _, patch := range patches {
		if p, ok := patch.(jsonpatch.Patch); ok {
			provider, err = applyToV1Alpha1(provider, p)
		} else {
			provider, err = applyTalos(provider, []configpatcher.Patch{patch})
		}

		if err != nil {
			return nil, err
		}
	}

	return provider, nil
}

func applyTalos(provider config.Provider, patches []configpatcher.Patch) (config.Provider, error) {
	out, err := configpatcher.Apply(configpatcher.WithConfig(provider), patches)
	if err != nil {
		return nil, fmt.Errorf("applying the patches: %w", err)
	}

	patched, err := out.Config()
	if err != nil {
		return nil, fmt.Errorf("the patched configuration: %w", err)
	}

	return patched, nil
}

// applyToV1Alpha1 applies p with Talos's JSON6902 to the v1alpha1 document encoded alone, and puts
// the result back in its place among the other documents.
func applyToV1Alpha1(provider config.Provider, p jsonpatch.Patch) (config.Provider, error) {
	docs := slices.Clone(provider.Documents())

	idx := slices.IndexFunc(docs, func(d coreconfig.Document) bool { _, ok := d.(*v1alpha1.Config); return ok })
	if idx < 0 {
		return nil, errors.New("a JSON6902 patch, and the configuration has no v1alpha1 document")
	}

	alone, err := container.New(docs[idx])
	if err != nil {
		return nil, err
	}

	data, err := alone.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return nil, err
	}

	if data, err = configpatcher.JSON6902(data, p); err != nil {
		return nil, fmt.Errorf("applying the patches: %w", err)
	}

	patched, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("the patched v1alpha1 document: %w", err)
	}

	docs[idx] = patched.Documents()[0]

	return container.New(docs...)
}

// validateCase loads text with Talos's loader and validates it as the platform mode would; a
// validation failure is a result (Valid false, Error why), not an error of the oracle.
func validateCase(text, modeName string) (result, error) {
	mode, err := parseMode(modeName)
	if err != nil {
		return result{}, err
	}

	provider, err := configloader.NewFromBytes([]byte(text))
	if err != nil {
		return result{Error: fmt.Sprintf("loading: %v", err)}, nil
	}

	warnings, err := provider.Validate(mode)
	if err != nil {
		return result{Error: fmt.Sprintf("validating (%s): %v", mode, err), Warnings: warnings}, nil
	}

	return result{Valid: true, Warnings: warnings}, nil
}
