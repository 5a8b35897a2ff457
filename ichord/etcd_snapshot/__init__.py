"""etcd snapshots of a Talos cluster: the file (``file``), taking one from a healthy control plane (``take``), the
``ichord cluster etcd-snapshot`` command (``cli``) and the snapshot an operation takes before it reboots control
planes (``destination``)."""
