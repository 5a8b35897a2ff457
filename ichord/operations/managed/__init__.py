"""What a step of every operation kind works with on the managed cluster (docs/architecture.md#layers): the step's
handles and inputs, the admin clients of the managed Kubernetes API, kube-apiserver's /readyz and restarts
(apiserver_restart.py), etcd health, render-and-compare (rendered.py) and the drain before a reboot (drain.py).

It names no kind: ``ca_rotation`` and ``config`` import it and never each other."""
