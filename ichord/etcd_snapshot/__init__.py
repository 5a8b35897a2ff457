"""etcd snapshots of a Talos cluster: the file (``file``), taking one from a healthy control plane (``take``) and
the ``ichord cluster etcd-snapshot`` command (``cli``). The snapshot an operation takes before it reboots control
planes is ichord/operations/etcd_snapshot.py."""
