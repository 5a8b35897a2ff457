"""Names of ichord's API: group, kinds, annotations, finalizers, condition types and reasons, events.

Constants, never string literals spread over the code (cert-manager's habit): a reason is part of
the API a user scripts against.
"""

from __future__ import annotations

GROUP = "ichor.maesh.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
TALOS_CLUSTER = "TalosCluster"
TALOS_MACHINE = "TalosMachine"
TALOS_OPERATION = "TalosOperation"
PLURALS = {TALOS_CLUSTER: "talosclusters", TALOS_MACHINE: "talosmachines", TALOS_OPERATION: "talosoperations"}

# Annotations and finalizers.
BUNDLE_EXPORTED_ANNOTATION = f"{GROUP}/bundle-exported"
CREDENTIALS_HANDOFF_ANNOTATION = f"{GROUP}/credentials-handoff"
#: Set with the hand-off's acknowledgement: where ``ichord cluster credentials`` wrote the kubeconfig (``-d``), so
#: the commands the rotation names later carry that path, not the default one (docs/decisions.md#cli-files).
CREDENTIALS_KUBECONFIG_ANNOTATION = f"{GROUP}/credentials-kubeconfig"
CA_ROTATION_FINALIZER = f"{GROUP}/ca-rotation"
CA_ROTATION_TEMPLATE_ANNOTATION = f"{GROUP}/ca-rotation"
#: On a bundle Secret: ichord watches Secrets with this label (set by ``ichord sim``, by the user, or by ichord when
#: it first reads a referenced Secret), so a changed bundle wakes its cluster at once, never a list of every Secret.
BUNDLE_LABEL = f"{GROUP}/bundle"
#: On a TalosCluster and on the TalosMachines an operation covers, while an operation of the cluster runs: their
#: deletion waits for the operation's completion or abandon (ichord/operations/guard.py).
OPERATION_GUARD_FINALIZER = f"{GROUP}/operation-in-progress"
#: On the bundle Secret while a ca-rotation holds new CA keys that the Secret does not hold as current yet
#: (ichord/operations/ca_rotation/custody.py); released at Done or abandon.
BUNDLE_CUSTODY_FINALIZER = f"{GROUP}/ca-custody"
#: The custody copy: a Secret of this type, owned by its TalosOperation, labelled with the operation's name, holding
#: the secrets.yaml the rotation started from and its rotation.yaml; it names the bundle Secret in an annotation.
CUSTODY_SECRET_TYPE = f"{GROUP}/ca-custody"
CUSTODY_OF_LABEL = f"{GROUP}/custody-of"
CUSTODY_BUNDLE_ANNOTATION = f"{GROUP}/bundle-secret"

# Bundle Secret keys.
SECRETS_KEY = "secrets.yaml"
ROTATION_KEY = "rotation.yaml"

# Leases.
LEADER_LEASE = "ichord-leader"
CLUSTER_LOCK_PREFIX = "ichord-lock-"
#: The cluster lock's name before ichord took one name everywhere: still read (and honoured) when the new Lease is
#: first created, so an operation an older version left holding it keeps the cluster fenced (operations/lock.py).
LEGACY_CLUSTER_LOCK_PREFIX = "ichor-lock-"

# Condition types.
READY = "Ready"
CONFIG_ROLLOUT = "ConfigRollout"
BUNDLE_BACKUP_STALE = "BundleBackupStale"
CERTIFICATES_EXPIRING = "CertificatesExpiring"
CA_CLIENTS_NOT_RESTARTED = "CAClientsNotRestarted"
CA_ROTATION = "CARotation"
DELETION_HELD = "DeletionHeld"
SUCCEEDED = "Succeeded"
#: On a TalosOperation: its steps have failed (API or node errors) for longer than the retry bound.
STEPS_FAILING = "StepsFailing"
#: On a TalosCluster with a spec.caRotation policy: a CA is inside its renewal period (operations/renewal.py).
ROTATION_DUE = "RotationDue"
#: On a TalosCluster with spec.maintenance.windows: whether ichord can read them (operations/windows.py).
MAINTENANCE_WINDOWS = "MaintenanceWindows"
#: An operation's condition reason outside every maintenance window of its cluster: the next disruptive step waits
#: for the opening its message names (operations/windows.py; phase InProgress, a Normal Event of the same name).
WAITING_FOR_WINDOW = "WaitingForWindow"
#: A node runs a Talos version of another contract than the TalosCluster's spec.talosVersion: nothing is applied to
#: it. The TalosMachine's Ready reason (False, with a Warning of this reason) and an operation's condition reason
#: (phase Paused) when it would apply to such a node (docs/decisions.md#contract-match).
CONTRACT_MISMATCH = "ContractMismatch"
#: An operation's condition reason (phase Paused) when it would apply a render to a node that trusts none of its
#: CAs of a kind: the bundle Secret is another cluster's; nothing is applied (docs/decisions.md#bundle-belongs).
BUNDLE_MISMATCH = "BundleMismatch"
#: On a TalosOperation the renewal policy created (``kubectl get top -l ichor.maesh.dev/planned-by=renew-before``).
PLANNED_BY_LABEL = f"{GROUP}/planned-by"
PLANNED_BY_RENEWAL = "renew-before"
#: On that operation: the CAs it renews, as ``target=notAfter`` pairs (for people; the name carries the identity).
RENEWS_ANNOTATION = f"{GROUP}/renews"
#: On a TalosCluster, only once a leader was missing: no replica has led for longer than the Lease
#: (watchers/leader_status.py).
LEADER_ELECTED = "LeaderElected"


class LeaderElectedReason:
    NO_LEADER = "NoLeader"
    LEADING = "Leading"
#: On a TalosOperation: its spec changed after it left Pending and ichord keeps the accepted one (operations/intent).
SPEC_CHANGE_IGNORED = "SpecChangeIgnored"

#: The TalosOperation kinds (spec.kind); everything else about each is its description (api/operation_kinds.py).
KIND_CA_ROTATION = "ca-rotation"
KIND_CONFIG = "config"


class ReadyReason:
    """TalosMachine Ready reasons (the CRDs); CROSS_NAMESPACE_REFUSED is the TalosCluster's."""

    CROSS_NAMESPACE_REFUSED = "CrossNamespaceRefused"

    CONVERGED = "Converged"
    APPLIED = "Applied"
    REBOOT_REQUIRED = "RebootRequired"
    API_SERVER_RESTART_REQUIRED = "APIServerRestartRequired"
    CA_ROTATION_IN_PROGRESS = "CARotationInProgress"
    #: An operation of another kind that holds the reconciler off the nodes is under way (its title in the message).
    OPERATION_UNDER_WAY = "OperationUnderWay"
    UNREACHABLE = "Unreachable"
    RENDER_FAILED = "RenderFailed"
    INVALID_CONFIG = "InvalidConfig"  # a patch or the render holds what Talos's decoder refuses: nothing applied
    UNSUPPORTED_CHANGE = "UnsupportedChange"
    CLUSTER_NOT_FOUND = "ClusterNotFound"
    INVALID_SPEC = "InvalidSpec"  # the TalosCluster's: its spec cannot be rendered from
    BUNDLE_INVALID = "BundleInvalid"
    APPLY_FAILED = "ApplyFailed"
    NOT_APPROVED = "NotApproved"
    #: An operation rebooting the machine, or restarting its kube-apiserver, within its bound (a planned loss).
    REBOOTING = "Rebooting"
    API_SERVER_RESTARTING = "APIServerRestarting"
    CONTRACT_MISMATCH = "ContractMismatch"  # the node runs another Talos contract than spec.talosVersion
    #: The management API answered 403 to a request the object needs (ichord.kube.forbidden names the chart value).
    FORBIDDEN = "Forbidden"
    #: The bundle's CAs are not among those the node trusts (another cluster's bundle): nothing is applied to it. On
    #: the TalosCluster too, naming both fingerprints (docs/decisions.md#bundle-belongs).
    BUNDLE_MISMATCH = "BundleMismatch"
    #: The TalosCluster's: approved machines are not Ready (their count, names and reasons in the message).
    MACHINES_NOT_READY = "MachinesNotReady"
    #: spec.address is no <ip or host>[:port] (empty, a URL, a bad port): nothing is dialled until it is corrected.
    INVALID_ADDRESS = "InvalidAddress"
    #: Another TalosMachine, created first, names the same node (docs/decisions.md#one-owner): nothing is applied.
    ADDRESS_IN_USE = "AddressInUse"
    #: Another TalosMachine of the cluster, created first, has the same spec.hostname (docs/decisions.md#one-owner):
    #: two nodes would register as one Kubernetes Node; nothing is applied.
    HOSTNAME_IN_USE = "HostnameInUse"
    #: Another TalosCluster, created first, names the same bundle Secret (docs/decisions.md#one-owner): nothing of
    #: this cluster is managed (its machines applied, its operations started). Also its operations' condition.
    BUNDLE_IN_USE = "BundleInUse"


class LockRefusal:
    """Why acquire_disruptive_lock refused."""

    HELD = "LockHeld"
    CLUSTER_CA_ROTATING = "ClusterCARotating"
    #: Another excluding operation of a kind that rotates no CA is under way (its kind's title in the message).
    CLUSTER_OPERATION_EXCLUSIVE = "ClusterOperationExclusive"
    CLUSTER_TRANSITIONING = "ClusterTransitioning"


class EventReason:
    OPERATION_STARTED = "OperationStarted"
    STAGE_APPLIED = "StageApplied"
    STAGE_VERIFIED = "StageVerified"
    ETCD_MEMBER_REBOOTED = "EtcdMemberRebooted"
    CLIENTS_RESTARTED = "ClientsRestarted"
    ROTATION_COMPLETED = "RotationCompleted"
    CONFIG_APPLIED = "ConfigApplied"
    OPERATION_BLOCKED = "OperationBlocked"
    OPERATION_PAUSED = "OperationPaused"
    OPERATION_RESUMED = "OperationResumed"
    AWAITING_CREDENTIALS = "AwaitingCredentials"  # the operator must act: the command to run is in the message
    CLUSTER_NOT_FOUND = "ClusterNotFound"
    BUNDLE_BACKUP_STALE = "BundleBackupStale"
    CERTIFICATES_EXPIRING = "CertificatesExpiring"
    CA_CLIENTS_NOT_RESTARTED = "CAClientsNotRestarted"
    REBOOT_REQUIRED = "RebootRequired"
    API_SERVER_RESTART_REQUIRED = "APIServerRestartRequired"
    MACHINE_UNREACHABLE = "MachineUnreachable"
    MACHINE_REBOOTING = "MachineRebooting"  # Normal: an operation rebooted the machine (planned)
    MACHINE_API_SERVER_RESTARTING = "MachineAPIServerRestarting"  # Normal: an operation restarts its kube-apiserver
    RENDER_FAILED = "RenderFailed"
    INVALID_CONFIG = "InvalidConfig"  # what Talos's decoder refuses (an unknown field, a wrong type): nothing applied
    #: On the cluster: a deleted rotation was abandoned (docs/decisions.md#abandon-or-hold).
    OPERATION_ABANDONED = "OperationAbandoned"
    DELETION_HELD = "DeletionHeld"  # a deleted rotation past its point of no return runs on to Done
    #                                 (also: a TalosCluster or TalosMachine deleted under a running operation)
    STEPS_FAILING = "StepsFailing"  # an operation's steps failed past the retry bound (operations/step_errors.py)
    FORBIDDEN = "Forbidden"  # a 403 from the management API blocks the object (one Warning per refusal)
    BUNDLE_RESTORE_REQUIRED = "BundleRestoreRequired"  # the bundle Secret lost the rotation's keys: restore-bundle
    SPEC_CHANGE_IGNORED = "SpecChangeIgnored"  # an operation's spec changed after its start; the change is ignored
    GATE_PASSED = "GatePassed"  # Normal: a health gate that failed passes again (operations/gates.py)
    ETCD_SNAPSHOT_TAKEN = "EtcdSnapshotTaken"  # before the first control-plane reboot, to spec.etcdSnapshots.path
    ROTATION_PLANNED = "RotationPlanned"  # Normal: the renewal policy created a ca-rotation (operations/renewal.py)
    WAITING_FOR_WINDOW = "WaitingForWindow"  # Normal: outside every maintenance window (operations/windows.py)
    CONTRACT_MISMATCH = "ContractMismatch"  # a machine's node runs another Talos contract: nothing applied to it
    BUNDLE_MISMATCH = "BundleMismatch"  # Warning on the cluster: its bundle is not the one its nodes trust


class CertificatesExpiringReason:
    """TalosCluster CertificatesExpiring reasons (docs/decisions.md#expiry-alerting)."""

    EXPIRING = "CAsExpiring"
    EXPIRED = "CAsExpired"
    NOT_EXPIRING = "NoCAExpiring"


class MaintenanceWindowsReason:
    """TalosCluster MaintenanceWindows reasons (docs/decisions.md#maintenance-windows)."""

    VALID = "WindowsValid"  # True: disruptive steps start only inside the windows the message names
    INVALID = "InvalidWindows"  # False: a window cannot be read; nothing disruptive starts (the field is named)
    NONE = "NoWindows"  # False: the windows were removed; operations disrupt at any time


class RotationDueReason:
    """TalosCluster RotationDue reasons (docs/decisions.md#renewal-policy)."""

    NOT_DUE = "NotDue"  # False: no CA is inside its renewal period
    AWAITING_APPROVAL = "AwaitingApproval"  # True: the planned operation is paused (approval Manual)
    ROTATION_UNDER_WAY = "RotationUnderWay"  # True: the operation covering the due CAs runs
    WAITING_FOR_OPERATION = "WaitingForOperation"  # True: another operation of the cluster is unfinished
    ROTATION_FAILED = "RotationFailed"  # True: the planned operation ended without renewing the CAs
    INVALID_RENEW_BEFORE = "InvalidRenewBefore"  # False: the policy cannot be followed; nothing planned
    OPERATION_NOT_CREATED = "OperationNotCreated"  # True: the API refused the create (a Warning: a person's problem)


class HealthGateReason:
    """A TalosOperation's kind condition while its health gates hold the next node (operations/gates.py)."""

    FAILING = "GateFailing"  # Paused: a gate fails (its name, its message); a Warning of this reason when it starts
    SOAKING = "Soaking"  # InProgress: the gates passed; asked again after spec.health.soak, then the node starts
    INVALID = "InvalidHealthGates"  # Paused: spec.health cannot be followed (a Warning); nothing runs until fixed


class BundleBackupStaleReason:
    """TalosCluster BundleBackupStale reasons: raised by the rotation, lowered by the expiry pass."""

    CA_ROTATED = "CARotated"
    BUNDLE_EXPORTED = "BundleExported"
    #: Unknown while the cluster's bundle is not the one its nodes trust: no saved copy is said to match it.
    BUNDLE_MISMATCH = "BundleMismatch"
    #: True after a BundleMismatch ended with the export annotation naming another bundle than the live one.
    NOT_EXPORTED = "BundleNotExported"



class CARotationReason:
    """TalosOperation CARotation condition reasons and ca-rotation terminal reasons (the CRDs,
    docs/decisions.md#rotation-state, docs/decisions.md#ca-rotation-passes)."""

    BLOCKED = "Blocked"
    ROTATED = "Rotated"
    ROTATED_CLIENTS_NOT_BACK = "RotatedClientsNotBack"
    AWAITING_CREDENTIALS = "AwaitingCredentials"
    SETTLING_CLIENTS = "SettlingClients"
    AWAITING_NODES = "AwaitingNodes"
    SETTLING_NODES = "SettlingNodes"
    RESTARTING_CLIENTS = "RestartingClients"
    IN_PROGRESS = "InProgress"
    VERIFYING_PASS = "VerifyingPass"  # noqa: S105 - a reason, not a secret: waiting for machines to answer
    REBOOTING_ETCD = "RebootingEtcd"  # the etcd roll of a pass: a control plane reboots to load the etcd CA
    PLANNED = "Planned"
    PAUSED = "Paused"  # spec.paused set while the rotation is under way (held at a step boundary)
    UNSUPPORTED_TARGET = "UnsupportedTarget"
    INVALID_SPEC = "InvalidSpec"
    #: extension-apiserver-authentication lacks the new CA (docs/decisions.md#aggregator-ca).
    AWAITING_AGGREGATOR_CA = "AwaitingAggregatorCA"
    SETTLING_AGGREGATOR = "SettlingAggregator"  # AggregatorAuthReset in Finalizing (docs/decisions.md#aggregator-ca)
    #: the bundle Secret was deleted, emptied of rotation.yaml or replaced mid-rotation: `ichord cluster
    #: restore-bundle` puts it back from the custody copy (custody.py)
    BUNDLE_RESTORE_REQUIRED = "BundleRestoreRequired"


class DeletionHeldReason:
    """DeletionHeld on a TalosCluster or TalosMachine deleted while an operation of its cluster runs (guard.py), and
    on an operation of any kind deleted past its point of no return (operations/deletion.py)."""

    OPERATION_IN_PROGRESS = "OperationInProgress"
    #: docs/decisions.md#abandon-or-hold: the kind's abandon rule refuses; the operation runs on to Done.
    PAST_POINT_OF_NO_RETURN = "PastPointOfNoReturn"


class StepInputsReason:
    """Why a step of any operation kind could not read its inputs (operations/managed/inputs.py): the reason of the
    kind's condition while it is blocked."""

    CLUSTER_UNAVAILABLE = "ClusterUnavailable"  # the step could not read its TalosCluster
    INVALID_SPEC = "InvalidSpec"  # the TalosCluster's spec (or the operation's maxUnavailable) cannot be used


class StepsFailingReason:
    """TalosOperation StepsFailing reasons (operations/step_errors.py): what kind of error keeps failing the steps."""

    API_ERROR = "APIError"  # the management or the managed cluster's Kubernetes API
    TALOS_ERROR = "TalosError"  # a Talos node's API
    STEP_ERROR = "StepError"  # another of ichord's typed errors (the bundle Secret unreadable, ...)
    RECOVERED = "Recovered"


class SpecChangeReason:
    """TalosOperation SpecChangeIgnored reasons (operations/intent.py)."""

    IGNORED = "SpecChangedAfterStart"
    AS_ACCEPTED = "SpecAsAccepted"


class CAClientsNotRestartedReason:
    """TalosCluster CAClientsNotRestarted reasons (docs/decisions.md#client-restarts)."""

    NOT_BACK = "RotatedClientsNotBack"
    ALL_BACK = "ClientsRestarted"


class Phase:
    """TalosOperation status.phase."""

    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    PAUSED = "Paused"
    COMPLETED = "Completed"
    FAILED = "Failed"


#: kube-system/extension-apiserver-authentication: kube-apiserver publishes the aggregator's accepted CAs there.
EXTENSION_AUTH_CONFIGMAP = "extension-apiserver-authentication"
EXTENSION_AUTH_CA_KEY = "requestheader-client-ca-file"
#: kube-root-ca.crt, the ConfigMap every pod's projected ca.crt is made from.
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
#: The pod-template annotation of a rollout restart (kubectl rollout restart).
RESTARTED_AT_ANNOTATION = "kubectl.kubernetes.io/restartedAt"
