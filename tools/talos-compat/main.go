// talos-compat: Talos's own Go client (github.com/siderolabs/talos/pkg/machinery/client), driving a
// simulated Talos cluster the way talosctl drives a node, so tests/real/test_talos_compat.py can hold
// `ichord sim talos` to what Talos's client accepts. scripts/tools.sh builds talos-compat-v1.13 (go.mod,
// machinery v1.13.9) and talos-compat-v1.14 (-modfile=go.v1.14.mod, machinery v1.14.1).
//
// It reads one batch as JSON on stdin and writes one JSON result per case, in order:
//
//	{"bundle": "secrets.yaml", "clusterName": "sim", "endpoint": "127.0.0.11:50000",
//	 "talosconfig": "where to write the talosconfig machinery makes from the bundle",
//	 "cases": [{"id": "...", "op": "version", "cred": "admin", "node": "...", "nodes": ["..."], "args": {...}}]}
//
// The talosconfig is machinery's (generate.Input.Talosconfig from the bundle, one endpoint); every case
// connects with it (or with a copy whose client certificate is the case's "cred") and targets nodes with
// `node` metadata (client.WithNode) or one-to-many `nodes` metadata (client.WithNodes), as talosctl -n
// does. Results are decoded with machinery's own types and written as JSON for the test to compare
// with the simulated cluster's state; a failed call gives its gRPC code and message.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	cosiapi "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/crypto/x509"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	talosruntime "github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	talossecrets "github.com/siderolabs/talos/pkg/machinery/resources/secrets"
	"github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/role"
)

type batch struct {
	Bundle      string     `json:"bundle"`
	ClusterName string     `json:"clusterName"`
	Endpoint    string     `json:"endpoint"`
	Talosconfig string     `json:"talosconfig"`
	Cases       []testCase `json:"cases"`
}

type testCase struct {
	ID    string         `json:"id"`
	Op    string         `json:"op"`
	Cred  string         `json:"cred,omitempty"`
	Node  string         `json:"node,omitempty"`
	Nodes []string       `json:"nodes,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
}

type result struct {
	ID      string `json:"id"`
	OK      bool   `json:"ok"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
	Result  any    `json:"result,omitempty"`
}

type env struct {
	bundle *secrets.Bundle
	config *clientconfig.Config
	name   string
	// other: an OS CA the cluster never saw (it signs the "untrusted" credentials).
	other *x509.PEMEncodedCertificateAndKey
}

func main() {
	var b batch
	if err := json.NewDecoder(os.Stdin).Decode(&b); err != nil {
		fail("reading the batch: %v", err)
	}

	bundle, err := secrets.LoadBundle(b.Bundle)
	if err != nil {
		fail("loading the bundle: %v", err)
	}

	in, err := generate.NewInput(b.ClusterName, "https://"+strings.Split(b.Endpoint, ":")[0]+":6443", "1.34.1",
		generate.WithSecretsBundle(bundle), generate.WithEndpointList([]string{b.Endpoint}))
	if err != nil {
		fail("generate input: %v", err)
	}

	cfg, err := in.Talosconfig()
	if err != nil {
		fail("talosconfig: %v", err)
	}

	if b.Talosconfig != "" {
		if err = cfg.Save(b.Talosconfig); err != nil {
			fail("saving the talosconfig: %v", err)
		}
	}

	e := &env{bundle: bundle, config: cfg, name: b.ClusterName}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)

	for _, c := range b.Cases {
		r := e.run(c)
		r.ID = c.ID

		if err := enc.Encode(r); err != nil {
			fail("writing: %v", err)
		}

		out.Flush() //nolint:errcheck
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "talos-compat: "+format+"\n", args...)
	os.Exit(2)
}

// credentials: the client certificate a case connects with, all but "admin" made here with machinery's x509.
func (e *env) credentials(cred string) (*x509.PEMEncodedCertificateAndKey, error) {
	now := time.Now()
	os := e.bundle.Certs.OS
	opts := []x509.Option{
		x509.Organization(string(role.Admin)),
		x509.NotBefore(now.Add(-time.Minute)),
		x509.NotAfter(now.Add(time.Hour)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}),
	}

	switch cred {
	case "", "admin":
		return nil, nil //nolint:nilnil
	case "reader":
		opts[0] = x509.Organization(string(role.Reader))
	case "operator":
		opts[0] = x509.Organization(string(role.Operator))
	case "etcd-backup":
		opts[0] = x509.Organization(string(role.EtcdBackup))
	case "untrusted":
		if e.other == nil {
			ca, err := secrets.NewTalosCA(now)
			if err != nil {
				return nil, err
			}

			e.other = x509.NewCertificateAndKeyFromCertificateAuthority(ca)
		}

		os = e.other
	case "expired":
		opts[1], opts[2] = x509.NotBefore(now.Add(-2*time.Hour)), x509.NotAfter(now.Add(-time.Hour))
	case "server-usage":
		opts[4] = x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth})
	case "both-usages":
		opts[4] = x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth, stdx509.ExtKeyUsageServerAuth})
	default:
		return nil, fmt.Errorf("unknown credentials %q", cred)
	}

	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(os)
	if err != nil {
		return nil, err
	}

	pair, err := x509.NewKeyPair(ca, opts...)
	if err != nil {
		return nil, err
	}

	return x509.NewCertificateAndKeyFromKeyPair(pair), nil
}

// client: machinery's client from the talosconfig (its context's certificate swapped for the case's).
func (e *env) client(ctx context.Context, cred string) (*client.Client, error) {
	pair, err := e.credentials(cred)
	if err != nil {
		return nil, err
	}

	cfg := e.config
	if pair != nil {
		ctxCopy := *e.config.Contexts[e.name]
		ctxCopy.Crt = b64(pair.Crt)
		ctxCopy.Key = b64(pair.Key)
		cfg = &clientconfig.Config{Context: e.name, Contexts: map[string]*clientconfig.Context{e.name: &ctxCopy}}
	}

	return client.New(ctx, client.WithConfig(cfg))
}

func (e *env) run(c testCase) (r result) {
	timeout := 30 * time.Second
	if t, ok := c.Args["timeout"].(float64); ok {
		timeout = time.Duration(t * float64(time.Second))
	}

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	if c.Op == "tls" {
		return e.tlsProbe(ctx, c)
	}

	cli, err := e.client(ctx, c.Cred)
	if err != nil {
		return errorResult(err)
	}
	defer cli.Close() //nolint:errcheck

	switch {
	case len(c.Nodes) > 0:
		ctx = client.WithNodes(ctx, c.Nodes...)
	case c.Node != "":
		ctx = client.WithNode(ctx, c.Node)
	}

	value, err := e.call(ctx, cli, c)
	if err != nil {
		r = errorResult(err)
		r.Result = value // one-to-many: what the nodes that answered said, next to the others' errors

		return r
	}

	return result{OK: true, Result: value}
}

func errorResult(err error) result {
	st := status.Convert(unwrapStatus(err))
	code := st.Code().String()

	// COSI's client turns NotFound into its own error type (state.IsNotFoundError), which carries no gRPC status.
	if state.IsNotFoundError(err) {
		code = codes.NotFound.String()
	}

	return result{Code: code, Message: st.Message(), Error: err.Error()}
}

// unwrapStatus finds the gRPC status inside a wrapped error (client.NodeError, fmt wrapping, multierror).
func unwrapStatus(err error) error {
	for cur := err; cur != nil; {
		if _, ok := status.FromError(cur); ok {
			if s, _ := status.FromError(cur); s.Code() != codes.Unknown || cur == err {
				return cur
			}
		}

		var grpcErr interface{ GRPCStatus() *status.Status }
		if errors.As(cur, &grpcErr) {
			return grpcErr.(error) //nolint:forcetypeassert
		}

		next := errors.Unwrap(cur)
		if next == nil {
			return cur
		}

		cur = next
	}

	return err
}

func b64(data []byte) string {
	return encodeBase64(data)
}

func encodeBase64(data []byte) string {
	return base64.StdEncoding.EncodeToString(data)
}

func decodeBase64(text string) []byte {
	data, _ := base64.StdEncoding.DecodeString(text) //nolint:errcheck

	return data
}

func protoJSON(m proto.Message) any {
	data, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false}.Marshal(m)
	if err != nil {
		return map[string]string{"marshalError": err.Error()}
	}

	var out any
	_ = json.Unmarshal(data, &out) //nolint:errcheck

	return out
}

func str(args map[string]any, key string) string {
	v, _ := args[key].(string) //nolint:errcheck

	return v
}

//nolint:gocyclo,cyclop
func (e *env) call(ctx context.Context, cli *client.Client, c testCase) (any, error) {
	switch c.Op {
	case "version":
		resp, err := cli.Version(ctx)

		return messages(resp), err
	case "services":
		resp, err := cli.ServiceList(ctx)

		return messages(resp), err
	case "service-restart":
		resp, err := cli.ServiceRestart(ctx, str(c.Args, "id"))

		return messages(resp), err
	case "etcd-members":
		resp, err := cli.EtcdMemberList(ctx, &machineapi.EtcdMemberListRequest{QueryLocal: c.Args["queryLocal"] == true})

		return messages(resp), err
	case "etcd-status":
		resp, err := cli.EtcdStatus(ctx)

		return messages(resp), err
	case "etcd-alarms":
		resp, err := cli.EtcdAlarmList(ctx)

		return messages(resp), err
	case "etcd-forfeit":
		resp, err := cli.EtcdForfeitLeadership(ctx, &machineapi.EtcdForfeitLeadershipRequest{})

		return messages(resp), err
	case "kubeconfig":
		data, err := cli.Kubeconfig(ctx)

		return map[string]any{"kubeconfig": string(data)}, err
	case "read":
		r, err := cli.Read(ctx, str(c.Args, "path"))
		if err != nil {
			return nil, err
		}

		data, err := io.ReadAll(r)
		if closeErr := r.Close(); err == nil {
			err = closeErr
		}

		return map[string]any{"data": string(data)}, err
	case "apply":
		return e.apply(ctx, cli, c)
	case "reboot":
		resp, err := cli.RebootWithResponse(ctx)

		return messages(resp), err
	case "reboot-wait":
		return rebootWait(ctx, cli, c)
	case "events":
		return events(ctx, cli, c)
	case "get":
		return cosiGet(ctx, cli, str(c.Args, "namespace"), str(c.Args, "type"), str(c.Args, "id"))
	case "list":
		return cosiList(ctx, cli, str(c.Args, "namespace"), str(c.Args, "type"))
	case "watch":
		return cosiWatch(ctx, cli, c)
	case "raw-watch":
		return e.rawWatch(ctx, c)
	case "talosctl-get":
		return talosctlGet(ctx, cli, c)
	case "resource-definitions":
		return resourceDefinitions(ctx, cli)
	case "processes":
		// a MachineService method the simulated node does not serve: Talos's client must meet Unimplemented.
		resp, err := cli.Processes(ctx)

		return messages(resp), err
	case "etcd-snapshot":
		r, err := cli.EtcdSnapshot(ctx, &machineapi.EtcdSnapshotRequest{})
		if err != nil {
			return nil, err
		}
		defer r.Close() //nolint:errcheck

		n, err := io.Copy(io.Discard, r)

		return map[string]any{"size": n}, err
	default:
		return nil, fmt.Errorf("unknown op %q", c.Op)
	}
}

// messages: a MachineService response as JSON (machinery's protojson), nil-safe.
func messages(resp proto.Message) any {
	if resp == nil || !resp.ProtoReflect().IsValid() {
		return nil
	}

	return protoJSON(resp)
}

func (e *env) apply(ctx context.Context, cli *client.Client, c testCase) (any, error) {
	data := []byte(str(c.Args, "data"))
	if path := str(c.Args, "file"); path != "" {
		var err error

		if data, err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}

	mode, ok := machineapi.ApplyConfigurationRequest_Mode_value[str(c.Args, "mode")]
	if !ok {
		return nil, fmt.Errorf("unknown mode %q", str(c.Args, "mode"))
	}

	req := &machineapi.ApplyConfigurationRequest{
		Data:   data,
		Mode:   machineapi.ApplyConfigurationRequest_Mode(mode),
		DryRun: c.Args["dryRun"] == true,
	}
	if t, ok := c.Args["tryTimeout"].(float64); ok {
		req.TryModeTimeout = durationpb.New(time.Duration(t * float64(time.Second)))
	}

	resp, err := cli.ApplyConfiguration(ctx, req)

	return messages(resp), err
}

// readBootID: what talosctl's reboot --wait compares before and after (the BootID resource on v1.14, the
// file before).
func readBootID(ctx context.Context, cli *client.Client) (string, error) {
	if id, ok, err := bootIDResource(ctx, cli); ok || err != nil {
		return id, err
	}

	r, err := cli.Read(ctx, "/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	defer r.Close() //nolint:errcheck

	data, err := io.ReadAll(r)

	return strings.TrimSpace(string(data)), err
}

// rebootWait: talosctl reboot --wait's tracker for one node: the events stream opened first (the hello
// event), the Reboot call, its actor's events until the stream drops, then reconnecting with every event
// replayed until the node reports running and ready, then the boot ID must have changed.
func rebootWait(ctx context.Context, cli *client.Client, c testCase) (any, error) {
	before, err := readBootID(ctx, cli)
	if err != nil {
		return nil, fmt.Errorf("boot ID before: %w", err)
	}

	ch := make(chan client.EventResult)
	if err = cli.EventsWatchV2(ctx, ch, client.WithTailEvents(0)); err != nil {
		return nil, err
	}

	resp, err := cli.RebootWithResponse(ctx)
	if err != nil {
		return nil, err
	}

	actor := resp.GetMessages()[0].GetActorId()
	seen := []string{}
	phase := "actor"

	for phase != "done" {
		select {
		case ev := <-ch:
			if ev.Error != nil {
				if client.StatusCode(ev.Error) != codes.Unavailable && !errors.Is(ev.Error, io.EOF) &&
					!strings.Contains(ev.Error.Error(), "EOF") {
					return map[string]any{"events": seen}, ev.Error
				}
				// the node went away: reconnect (every event replayed) until it is back
				seen = append(seen, "unavailable")

				for {
					ch = make(chan client.EventResult)
					if err = cli.EventsWatchV2(ctx, ch, client.WithTailEvents(-1)); err == nil {
						break
					}

					if ctx.Err() != nil {
						return map[string]any{"events": seen}, err
					}

					time.Sleep(50 * time.Millisecond)
				}

				phase = "ready"

				continue
			}

			desc := describe(ev.Event)
			if phase == "actor" && ev.Event.ActorID == actor {
				seen = append(seen, desc)
			}

			if phase == "ready" {
				seen = append(seen, desc)

				if ms, ok := ev.Event.Payload.(*machineapi.MachineStatusEvent); ok &&
					ms.GetStage() == machineapi.MachineStatusEvent_RUNNING && ms.GetStatus().GetReady() {
					phase = "done"
				}
			}
		case <-ctx.Done():
			return map[string]any{"events": seen}, ctx.Err()
		}
	}

	after, err := readBootID(ctx, cli)
	if err != nil {
		return nil, fmt.Errorf("boot ID after: %w", err)
	}

	return map[string]any{"actor": actor, "before": before, "after": after, "events": seen}, nil
}

func describe(ev client.Event) string {
	switch msg := ev.Payload.(type) {
	case *machineapi.SequenceEvent:
		return fmt.Sprintf("sequence %s %s", msg.GetSequence(), msg.GetAction())
	case *machineapi.PhaseEvent:
		return fmt.Sprintf("phase %s %s", msg.GetPhase(), msg.GetAction())
	case *machineapi.TaskEvent:
		return fmt.Sprintf("task %s %s", msg.GetTask(), msg.GetAction())
	case *machineapi.MachineStatusEvent:
		return fmt.Sprintf("machine %s ready=%v", msg.GetStage(), msg.GetStatus().GetReady())
	case *machineapi.ServiceStateEvent:
		return fmt.Sprintf("service %s %s", msg.GetService(), msg.GetAction())
	default:
		return ev.TypeURL
	}
}

// events: the stream as `talosctl events --tail N` reads it (EventsWatchV2), up to "count" events.
func events(ctx context.Context, cli *client.Client, c testCase) (any, error) {
	tail, _ := c.Args["tail"].(float64)   //nolint:errcheck
	count, _ := c.Args["count"].(float64) //nolint:errcheck
	ch := make(chan client.EventResult)

	opts := []client.EventsOptionFunc{client.WithTailEvents(int32(tail))}
	if actor := str(c.Args, "actor"); actor != "" {
		opts = append(opts, client.WithActorID(actor))
	}

	out := []map[string]any{}

	if len(c.Nodes) > 0 {
		// talosctl events -n A,B: EventsWatch over the one-to-many stream (every node's events, each with its
		// hostname; EventsWatchV2 follows one node only).
		watchCtx, stop := context.WithCancel(ctx)
		defer stop()

		err := cli.EventsWatch(watchCtx, func(events <-chan client.Event) {
			for ev := range events {
				if len(out) < int(count) {
					out = append(out, map[string]any{"node": ev.Node, "id": ev.ID, "actor": ev.ActorID,
						"type": ev.TypeURL, "event": describe(ev)})
				}

				if len(out) == int(count) {
					stop()
				}
			}
		}, opts...)

		return out, err
	}

	if err := cli.EventsWatchV2(ctx, ch, opts...); err != nil {
		return nil, err
	}

	for len(out) < int(count) {
		select {
		case ev := <-ch:
			if ev.Error != nil {
				return out, ev.Error
			}

			out = append(out, map[string]any{"node": ev.Event.Node, "id": ev.Event.ID, "actor": ev.Event.ActorID,
				"type": ev.Event.TypeURL, "event": describe(ev.Event)})
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}

	return out, nil
}

// described: a resource decoded by machinery (its Go type, metadata and typed spec).
func described(r resource.Resource) map[string]any {
	md := r.Metadata()
	out := map[string]any{
		"goType":    fmt.Sprintf("%T", r),
		"namespace": md.Namespace(),
		"type":      md.Type(),
		"id":        md.ID(),
		"version":   md.Version().String(),
		"phase":     md.Phase().String(),
	}

	switch res := r.(type) {
	case *config.MachineConfig:
		provider := res.Provider()
		out["spec"] = map[string]any{
			"machineType": provider.Machine().Type().String(),
			"bytes":       configBytes(res),
		}
	case *meta.ResourceDefinition:
		out["spec"] = res.TypedSpec()
	case *k8s.StaticPodStatus:
		out["spec"] = res.TypedSpec().PodStatus
	default:
		spec := r.Spec()
		if data, err := json.Marshal(spec); err == nil {
			var v any
			_ = json.Unmarshal(data, &v) //nolint:errcheck
			out["spec"] = v
		}
	}

	return out
}

func cosiGet(ctx context.Context, cli *client.Client, ns, typ, id string) (any, error) {
	r, err := cli.COSI.Get(ctx, resource.NewMetadata(ns, typ, id, resource.VersionUndefined))
	if err != nil {
		return nil, err
	}

	return described(r), nil
}

func cosiList(ctx context.Context, cli *client.Client, ns, typ string) (any, error) {
	list, err := cli.COSI.List(ctx, resource.NewMetadata(ns, typ, "", resource.VersionUndefined))
	if err != nil {
		return nil, err
	}

	out := []any{}
	for _, r := range list.Items {
		out = append(out, described(r))
	}

	return out, nil
}

// cosiWatch: a kind watch (bootstrapped or not) or a watch of one ID, as machinery's COSI adapter runs them;
// "count" events are collected after the adapter consumed the server's first (empty) response.
func cosiWatch(ctx context.Context, cli *client.Client, c testCase) (any, error) {
	ns, typ, id := str(c.Args, "namespace"), str(c.Args, "type"), str(c.Args, "id")
	count, _ := c.Args["count"].(float64) //nolint:errcheck
	ch := make(chan state.Event)

	var err error

	md := resource.NewMetadata(ns, typ, id, resource.VersionUndefined)

	switch {
	case id != "":
		err = cli.COSI.Watch(ctx, md, ch)
	default:
		var opts []state.WatchKindOption
		if c.Args["bootstrap"] == true {
			opts = append(opts, state.WithBootstrapContents(true))
		}

		err = cli.COSI.WatchKind(ctx, md, ch, opts...)
	}

	if err != nil {
		return nil, err
	}

	out := []map[string]any{}

	for len(out) < int(count) {
		select {
		case ev := <-ch:
			item := map[string]any{"event": ev.Type.String()}
			if ev.Resource != nil {
				item["resource"] = described(ev.Resource)
			}

			if ev.Old != nil {
				item["old"] = ev.Old.Metadata().Version().String()
			}

			if ev.Error != nil {
				item["error"] = ev.Error.Error()
			}

			out = append(out, item)

			if ev.Type == state.Errored {
				return out, ev.Error
			}
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}

	return out, nil
}

// talosctlGet: `talosctl get TYPE [ID]`: the type resolved through the ResourceDefinitions first, then a Get
// or a List in the definition's default namespace.
func talosctlGet(ctx context.Context, cli *client.Client, c testCase) (any, error) {
	ns := resource.Namespace(str(c.Args, "namespace"))

	rd, err := cli.ResolveResourceKind(ctx, &ns, str(c.Args, "type"))
	if err != nil {
		return nil, err
	}

	if id := str(c.Args, "id"); id != "" {
		r, err := cosiGet(ctx, cli, ns, rd.TypedSpec().Type, id)

		return map[string]any{"definition": rd.Metadata().ID(), "namespace": ns, "items": []any{r}}, err
	}

	items, err := cosiList(ctx, cli, ns, rd.TypedSpec().Type)

	return map[string]any{"definition": rd.Metadata().ID(), "namespace": ns, "items": items}, err
}

// resourceDefinitions: what the node serves, each next to machinery's own definition of the same type
// (nil when machinery does not define it).
func resourceDefinitions(ctx context.Context, cli *client.Client) (any, error) {
	list, err := safe.StateListAll[*meta.ResourceDefinition](ctx, cli.COSI)
	if err != nil {
		return nil, err
	}

	known := map[string]meta.ResourceDefinitionSpec{}

	for _, r := range []meta.ResourceDefinitionProvider{
		&config.MachineConfig{}, &k8s.Nodename{}, &k8s.StaticPodStatus{}, &talosruntime.MachineStatus{},
		&talossecrets.EtcdRoot{}, &talossecrets.Etcd{}, &talossecrets.OSRoot{}, &talossecrets.KubernetesRoot{},
		&v1alpha1.Service{}, &meta.ResourceDefinition{}, &meta.Namespace{}, extraDefinitions(),
	} {
		if r == nil {
			continue
		}

		spec := r.ResourceDefinition()
		if err := spec.Fill(); err != nil {
			return nil, err
		}

		known[spec.ID()] = spec
	}

	out := []any{}

	for rd := range list.All() {
		var mine any
		if spec, ok := known[rd.Metadata().ID()]; ok {
			mine = spec
		}

		out = append(out, map[string]any{"id": rd.Metadata().ID(), "served": rd.TypedSpec(), "machinery": mine})
	}

	slices.SortFunc(out, func(a, b any) int {
		return strings.Compare(a.(map[string]any)["id"].(string), b.(map[string]any)["id"].(string)) //nolint:forcetypeassert
	})

	return out, nil
}

// tlsProbe: the bare TLS handshake and first read with the case's credentials, recording the CAs the server
// advertises in its CertificateRequest and the exact error the client sees (an alert or a closed connection).
func (e *env) tlsProbe(ctx context.Context, c testCase) result {
	pair, err := e.credentials(c.Cred)
	if err != nil {
		return errorResult(err)
	}

	if pair == nil {
		ctxCfg := e.config.Contexts[e.name]
		crt, key := decodeBase64(ctxCfg.Crt), decodeBase64(ctxCfg.Key)
		pair = &x509.PEMEncodedCertificateAndKey{Crt: crt, Key: key}
	}

	cert, err := tls.X509KeyPair(pair.Crt, pair.Key)
	if err != nil {
		return errorResult(err)
	}

	pool := stdx509.NewCertPool()
	pool.AppendCertsFromPEM(e.bundle.Certs.OS.Crt)

	var advertised []string

	cfg := &tls.Config{
		RootCAs:    pool,
		ServerName: str(c.Args, "serverName"),
		NextProtos: []string{"h2"},
		GetClientCertificate: func(info *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			for _, raw := range info.AcceptableCAs {
				advertised = append(advertised, encodeBase64(raw))
			}

			if c.Cred == "none" {
				return &tls.Certificate{}, nil
			}

			return &cert, nil
		},
	}
	if max := str(c.Args, "maxVersion"); max == "1.2" {
		cfg.MaxVersion = tls.VersionTLS12
	}

	dialer := tls.Dialer{Config: cfg}

	conn, err := dialer.DialContext(ctx, "tcp", str(c.Args, "address"))
	out := map[string]any{"advertisedCAs": advertised}

	if err != nil {
		out["handshake"] = err.Error()

		return result{OK: true, Result: out}
	}
	defer conn.Close() //nolint:errcheck

	// HTTP/2 client preface, then read: a refusal after the handshake (TLS 1.3) shows here.
	_, _ = conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")) //nolint:errcheck
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))                                         //nolint:errcheck
	buf := make([]byte, 64)
	_, err = conn.Read(buf)

	out["handshake"] = "ok"
	if err != nil {
		out["read"] = err.Error()
	} else {
		out["read"] = "ok"
	}

	return result{OK: true, Result: out}
}

// rawWatch: a Watch request exactly as given (e.g. one ID with bootstrap contents, which machinery's adapter
// never sends: ichord's own client did), on a connection made from the same talosconfig context, read to
// its first "count" responses, each response's events kept apart.
func (e *env) rawWatch(ctx context.Context, c testCase) (any, error) {
	tc := e.config.Contexts[e.name]

	cert, err := tls.X509KeyPair(decodeBase64(tc.Crt), decodeBase64(tc.Key))
	if err != nil {
		return nil, err
	}

	pool := stdx509.NewCertPool()
	pool.AppendCertsFromPEM(decodeBase64(tc.CA))

	conn, err := grpc.NewClient(tc.Endpoints[0], grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: strings.Split(tc.Endpoints[0], ":")[0],
	})))
	if err != nil {
		return nil, err
	}
	defer conn.Close() //nolint:errcheck

	req := &cosiapi.WatchRequest{
		Namespace:  str(c.Args, "namespace"),
		Type:       str(c.Args, "type"),
		ApiVersion: 1,
		Options:    &cosiapi.WatchOptions{BootstrapContents: c.Args["bootstrap"] == true},
	}
	if id := str(c.Args, "id"); id != "" {
		req.Id = &id
	}

	stream, err := cosiapi.NewStateClient(conn).Watch(ctx, req)
	if err != nil {
		return nil, err
	}

	count, _ := c.Args["count"].(float64) //nolint:errcheck
	out := []any{}

	for len(out) < int(count) {
		resp, err := stream.Recv()
		if err != nil {
			return out, err
		}

		events := []string{}
		for _, ev := range resp.GetEvent() {
			events = append(events, ev.GetEventType().String()+" "+ev.GetResource().GetMetadata().GetId())
		}

		out = append(out, events)
	}

	return out, nil
}

// configBytes: the configuration as machinery re-encodes it (the test parses it back and compares values).
func configBytes(res *config.MachineConfig) string {
	data, err := res.Provider().Bytes()
	if err != nil {
		return "error: " + err.Error()
	}

	return string(data)
}
