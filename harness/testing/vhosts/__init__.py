"""The virtual-host test bed: three virtual hosts on one machine (network, host-name and time
namespaces, veth pairs on a bridge, one sshd each), on which the harness runs across hosts for
real. Its shell scripts are files of this package, shipped with it:

- ``start_vhosts.sh`` builds the bed (as root): ``bash harness/testing/vhosts/start_vhosts.sh``;
- ``vhost_exec.sh HOST CMD...`` runs a command on a virtual host;
- ``stop_vhosts.sh`` removes all of it.

``tests/test_vhosts.py`` starts and uses it; ``bench agreement``'s ``kernel_shaping`` case uses
it when it is running (:mod:`harness.testing.vhosts.shaping`). :mod:`harness.testing.vhosts.bed`
holds what both need from Python.
"""
