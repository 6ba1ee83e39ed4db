"""Runs the plugin natively: `python3 -m unittest` in this folder (the SDK is found beside it
in a Heddle checkout, or wherever PYTHONPATH points)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from heddle_plugin import PluginError, run  # noqa: E402

from app import SocketIfname  # noqa: E402


def iface(name, kind="ethernet", up=True, master=None, virtual=False):
    return {"name": name, "kind": kind, "operstate": "up" if up else "down",
            "master": master, "virtual_device": virtual}


class SocketIfnameTest(unittest.TestCase):
    def test_first_physical_ethernet_that_is_up_is_recommended(self):
        facts = {"network": {"interfaces": [
            iface("lo", kind="loopback", virtual=True),
            iface("docker0", virtual=True),
            iface("eth1", up=False),
            iface("ib0", kind="infiniband"),
            iface("enP1s1", master="enp1s0f0"),
            iface("enp1s0f0"),
        ]}}
        d = run(SocketIfname, facts)
        self.assertEqual(d.env_value("NCCL_SOCKET_IFNAME"), "enp1s0f0")
        self.assertEqual(d.trait_value("my.socket_ifname"), "enp1s0f0")
        self.assertEqual(d.warnings, [])

    def test_a_bond_stands_for_its_members(self):
        facts = {"network": {"interfaces": [
            iface("bond0", virtual=True), iface("eno1", master="bond0"), iface("eno2", master="bond0"),
        ]}}
        self.assertEqual(run(SocketIfname, facts).env_value("NCCL_SOCKET_IFNAME"), "bond0")

    def test_several_candidates_are_warned_about(self):
        d = run(SocketIfname, {"network": {"interfaces": [iface("eth0"), iface("eth1")]}})
        self.assertEqual(d.env_value("NCCL_SOCKET_IFNAME"), "eth0")
        self.assertEqual(len(d.warnings), 1)

    def test_nodes_without_a_candidate_get_an_empty_detection(self):
        self.assertTrue(run(SocketIfname, {"schema_version": 1}).is_empty())
        all_down = {"network": {"interfaces": [iface("eth0", up=False)]}}
        self.assertTrue(run(SocketIfname, all_down).is_empty())

    def test_facts_of_the_wrong_shape_are_a_plugin_error(self):
        with self.assertRaises(PluginError) as e:
            run(SocketIfname, {"network": {"interfaces": "eth0"}})
        self.assertEqual(e.exception.code, "bad-facts")

    def test_reads_name_fields_of_every_interface(self):
        self.assertTrue(all(r.startswith("/network/interfaces/*/") for r in SocketIfname.info().reads))


if __name__ == "__main__":
    unittest.main()
