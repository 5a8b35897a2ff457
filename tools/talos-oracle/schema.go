package main

// The "schema" case: what Talos's configuration decoder accepts, derived from machinery itself, for
// ichord's strict validation (ichord/render/schema/, written by tools/talos-oracle/gen_schema.py).
//
// Talos decodes every document (configloader's decoder) in two steps: go-yaml decodes the YAML node
// into the document's Go struct (wrong types fail there), then xyaml.CheckUnknownKeys walks the node
// beside the Go type and refuses keys no field carries. This case walks the Go type of every
// registered document kind the same way (the yaml tags as CheckUnknownKeys reads them) and, for every
// type it meets, decodes each probe value the caller gives (a YAML scalar, mapping or sequence, as
// ichord encodes it) into a fresh value of that type exactly as the decoder does (go-yaml's Node.Decode,
// then CheckUnknownKeys) and records which probes Talos accepts. The Go types' own unmarshalers (custom
// UnmarshalYAML, TextUnmarshaler) are thereby judged by their own code, not described by hand.

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/siderolabs/gen/xyaml"
	yaml "go.yaml.in/yaml/v4"

	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
)

type schemaInput struct {
	// Probes: name -> a YAML value as ichord writes it.
	Probes map[string]string `json:"probes"`
}

type schemaType struct {
	Go   string `json:"go"`
	Kind string `json:"kind"` // struct, slice, map, scalar, any
	// Fields of a struct: YAML key -> type id (the keys CheckUnknownKeys accepts).
	Fields map[string]string `json:"fields,omitempty"`
	// Open: a struct with an inline map (any key; values of this type id).
	Open string `json:"open,omitempty"`
	// Elem: a slice's element or a map's value type id.
	Elem string `json:"elem,omitempty"`
	// Custom: the type (or its pointer) has its own YAML or text unmarshaler.
	Custom bool `json:"custom,omitempty"`
	// Accepts: the probes this type decodes (go-yaml, then CheckUnknownKeys).
	Accepts []string `json:"accepts"`
	// Bits and Unsigned: an integer's size (go-yaml refuses a number that overflows it).
	Bits     int  `json:"bits,omitempty"`
	Unsigned bool `json:"unsigned,omitempty"`
	// Enum: the names an enumerated type (an integer with its own unmarshaler and String) decodes, found by
	// decoding the String of each value from 0 to 1023 as Talos would.
	Enum []string `json:"enum,omitempty"`
}

type schemaDocument struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Type       string `json:"type"`
}

type schemaOutput struct {
	Documents map[string]schemaDocument `json:"documents"`
	Types     map[string]*schemaType    `json:"types"`
}

var textUnmarshalerType = reflect.TypeOf((*interface{ UnmarshalText([]byte) error })(nil)).Elem()

type yamlUnmarshaler interface{ UnmarshalYAML(*yaml.Node) error }

type obsoleteYAMLUnmarshaler interface {
	UnmarshalYAML(func(any) error) error
}

var (
	yamlUnmarshalerType     = reflect.TypeOf((*yamlUnmarshaler)(nil)).Elem()
	obsoleteUnmarshalerType = reflect.TypeOf((*obsoleteYAMLUnmarshaler)(nil)).Elem()
	anyType                 = reflect.TypeOf((*any)(nil)).Elem()
)

func hasUnmarshaler(t reflect.Type) bool {
	for _, c := range []reflect.Type{t, reflect.PointerTo(t)} {
		if c.Implements(yamlUnmarshalerType) || c.Implements(obsoleteUnmarshalerType) || c.Implements(textUnmarshalerType) {
			return true
		}
	}

	return false
}

type schemaWalker struct {
	probes map[string]*yaml.Node
	names  []string
	out    map[string]*schemaType
}

func typeID(t reflect.Type) string {
	if t.Name() != "" && t.PkgPath() != "" {
		return t.PkgPath() + "." + t.Name()
	}

	return t.String()
}

// probe decodes every probe into a new value of t as Talos's decoder would, and names those it accepts.
func (w *schemaWalker) probe(t reflect.Type) []string {
	accepted := []string{}

	for _, name := range w.names {
		if decodes(t, w.probes[name]) {
			accepted = append(accepted, name)
		}
	}

	return accepted
}

func decodes(t reflect.Type, node *yaml.Node) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()

	target := reflect.New(t).Interface()
	if err := node.Decode(target); err != nil {
		return false
	}

	return xyaml.CheckUnknownKeys(target, node) == nil
}

func (w *schemaWalker) walk(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}

	id := typeID(t)
	if _, seen := w.out[id]; seen {
		return id
	}

	st := &schemaType{Go: t.String(), Custom: hasUnmarshaler(t)}
	w.out[id] = st // before recursing: types may refer to themselves
	st.Accepts = w.probe(t)

	// A type that takes no mapping (its own unmarshaler reads a scalar) has no fields a document can reach.
	takesMapping := slices.Contains(st.Accepts, "emptymap")

	switch {
	case t == anyType:
		st.Kind = "any"
	case t.Kind() == reflect.Struct:
		st.Kind = "struct"
		st.Fields = map[string]string{}

		if !takesMapping {
			st.Fields = nil

			break
		}

		for _, f := range reflect.VisibleFields(t) {
			key, inlineMap, skip := yamlKey(f)
			if skip {
				continue
			}

			if inlineMap {
				st.Open = w.walk(f.Type.Elem())
				st.Fields = nil

				break
			}

			if key != "" {
				st.Fields[key] = w.walk(f.Type)
			}
		}
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		st.Kind = "slice"
		st.Elem = w.walk(t.Elem())
	case t.Kind() == reflect.Map:
		st.Kind = "map"
		st.Elem = w.walk(t.Elem())
	case t.Kind() == reflect.Interface:
		st.Kind = "any"
	default:
		st.Kind = "scalar"

		switch t.Kind() { //nolint:exhaustive
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			st.Bits = t.Bits()
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			st.Bits, st.Unsigned = t.Bits(), true
		}

		if st.Custom && st.Bits > 0 {
			st.Enum = enumNames(t)
		}
	}

	return id
}

// enumNames: the String of every value 0..1023 of an integer type that its unmarshaler decodes back.
func enumNames(t reflect.Type) []string {
	if !t.Implements(reflect.TypeOf((*fmt.Stringer)(nil)).Elem()) {
		return nil
	}

	names := []string{}

	for i := range 1024 {
		v := reflect.New(t).Elem()
		if st := t.Kind(); st >= reflect.Uint && st <= reflect.Uintptr {
			if v.OverflowUint(uint64(i)) {
				break
			}

			v.SetUint(uint64(i))
		} else {
			if v.OverflowInt(int64(i)) {
				break
			}

			v.SetInt(int64(i))
		}

		name := v.Interface().(fmt.Stringer).String() //nolint:forcetypeassert
		node := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name}

		if !slices.Contains(names, name) && decodes(t, node) {
			names = append(names, name)
		}
	}

	return names
}

// yamlKey is the key CheckUnknownKeys (xyaml.structKeys) gives a field; inlineMap when the field is an
// inline map (the struct then takes any key); skip for `yaml:"-"` and inline non-map fields (their
// promoted fields are visible on their own).
func yamlKey(f reflect.StructField) (key string, inlineMap, skip bool) {
	tag := f.Tag.Get("yaml")
	if tag == "" {
		return strings.ToLower(f.Name), false, false
	}

	if tag == "-" {
		return "", false, true
	}

	name, opts, _ := strings.Cut(tag, ",")
	if slices.Contains(strings.Split(opts, ","), "inline") && f.Type.Kind() == reflect.Map {
		return "", true, false
	}

	return name, false, false
}

func schemaCase(in *schemaInput) (result, error) {
	if len(in.Probes) == 0 {
		return result{}, errors.New("a schema case needs probes")
	}

	w := &schemaWalker{probes: map[string]*yaml.Node{}, out: map[string]*schemaType{}}

	for name, text := range in.Probes {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			return result{}, fmt.Errorf("probe %s: %w", name, err)
		}

		if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
			return result{}, fmt.Errorf("probe %s is not one YAML value", name)
		}

		w.probes[name] = doc.Content[0]
		w.names = append(w.names, name)
	}

	slices.Sort(w.names)

	out := schemaOutput{Documents: map[string]schemaDocument{}, Types: w.out}
	out.Documents["v1alpha1"] = schemaDocument{Type: w.walk(reflect.TypeOf(v1alpha1.Config{}))}

	for _, kind := range registeredKinds() {
		if kind == "v1alpha1" {
			continue
		}

		// The registry's document for the kind, as the decoder makes it (apiVersion v1alpha1: every
		// registered kind's only version; the registry refuses any other).
		doc, err := registryNew(kind, "v1alpha1")
		if err != nil {
			return result{}, fmt.Errorf("kind %s: %w", kind, err)
		}

		out.Documents[kind] = schemaDocument{APIVersion: "v1alpha1", Type: w.walk(reflect.TypeOf(doc))}
	}

	return result{Valid: true, Schema: &out}, nil
}
